import json
from pathlib import Path

import pytest

from hwrun.kv.footprint import footprint
from hwrun.models import MODELS, ConfigError, UnknownModelError, get_model, spec_from_hf_config
from hwrun.models.hf_config import load_hf_config

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_known_models_are_consistent(name):
    model = get_model(name)
    assert model.check() == []
    assert model.name == name
    assert model.source


def test_kimi_layer_counts_match_the_seed():
    for name in ("kimi-k3", "kimi-k3.1-pro"):
        layers = get_model(name).layers
        assert len(layers) == 93
        assert sum(layer.kda is not None for layer in layers) == 69
        assert sum(layer.owns_latent for layer in layers) == 24
        assert layers[-1].owns_latent  # Kimi Linear's pattern ends on full attention
    k31 = get_model("kimi-k3.1-pro").layers
    assert all(x.indexer.heads == 32 and x.indexer.topk == 2048 for x in k31 if x.indexer)
    assert not any(x.indexer for x in get_model("kimi-k3").layers)


def test_mistral_large_4_sharing_reading():
    layers = get_model("mistral-large-4").layers
    assert len(layers) == 72
    nope = [x.index for x in layers if x.latent.nope]
    assert nope == list(range(3, 72, 4))
    consumers = [x.index for x in layers if x.latent_owner is not None]
    assert consumers == [39, 43, 47, 51, 55, 59, 63, 67, 71]
    assert {x.latent_owner for x in layers if x.latent_owner is not None} == {35}
    assert sum(x.owns_latent for x in layers) == 63
    assert sum(x.owns_index_keys for x in layers) == 44
    sharers = [x for x in layers if x.indexer_owner is not None]
    assert len(sharers) == 28
    # a sharer reuses the nearest earlier indexer layer
    for x in sharers:
        between = layers[x.indexer_owner + 1 : x.index]
        assert all(not y.owns_index_keys for y in between)
    # the nine consumers each run their own indexer (the seed's HiSparse section)
    assert all(layers[i].owns_index_keys for i in consumers)


def test_dspark_variant_adds_three_windows_of_about_7_mb():
    fp = footprint(get_model("mistral-large-4-dspark"), tp=8, dcp=8)
    assert fp.window_layers == 3
    assert fp.window_bytes_per_request == 3 * 2048 * 1152  # the seed's "about 7 MB per request"
    assert fp.per_global_token()["total"] == 47136 / 8


def test_deepseek_v32_fixture():
    model = load_hf_config(FIXTURES / "deepseek_v32_tiny.json")
    assert len(model.layers) == 4
    assert all(x.owns_latent and x.owns_index_keys for x in model.layers)
    assert model.layers[0].indexer.heads == 4 and model.layers[0].indexer.topk == 16
    assert footprint(model).bytes_per_token == 4 * (656 + 132)


def test_glm_moe_dsa_fixture_shares_indexers():
    model = load_hf_config(FIXTURES / "glm_moe_dsa_tiny.json")
    owners = [x.indexer_owner for x in model.layers]
    assert owners == [None, 0, 0, None, 3, None]
    fp = footprint(model)
    assert (fp.latent_layers, fp.index_layers) == (6, 3)


def test_glm_moe_dsa_pattern_and_frequency_keys():
    config = json.loads((FIXTURES / "glm_moe_dsa_tiny.json").read_text())
    del config["indexer_types"]
    pattern = spec_from_hf_config({**config, "index_topk_pattern": "FSFSSF"})
    assert [x.owns_index_keys for x in pattern.layers] == [1, 0, 1, 0, 0, 1]
    # transformers' rule: full when max(i - offset + 1, 0) % freq == 0
    freq = spec_from_hf_config({**config, "index_topk_freq": 2, "index_skip_topk_offset": 2})
    assert [x.owns_index_keys for x in freq.layers] == [1, 1, 0, 1, 0, 1]
    assert all(x.owns_index_keys for x in spec_from_hf_config(config).layers)


def test_kimi_linear_fixture_reads_one_indexed_layers():
    model = load_hf_config(FIXTURES / "kimi_linear_tiny.json")
    assert [x.kda is not None for x in model.layers] == [True, True, True, False, False]
    assert model.layers[3].latent.nope and model.layers[3].latent.format == "bf16"
    kda = model.layers[0].kda
    assert (kda.heads, kda.key_dim, kda.value_dim, kda.conv_kernel) == (4, 64, 64, 4)
    # recurrent [4, 64, 64] fp32 + conv 3 x (4*64) channels x 3 columns bf16, halved at TP2
    assert kda.bytes_per_request(tp=2) == (2 * 64 * 64 * 4) + (2 * 64 * 3 * 3 * 2)


def test_kimi_k3_data_matches_its_config_json():
    from_config = load_hf_config(FIXTURES / "kimi_k3_config.json").with_formats(latent="fp8_e4m3")
    data = get_model("kimi-k3")
    assert [x.kda for x in from_config.layers] == [x.kda for x in data.layers]
    assert [x.latent for x in from_config.layers] == [x.latent for x in data.layers]
    assert footprint(from_config, tp=8).bytes_per_token == 13824


def test_text_config_of_a_multimodal_wrapper_is_read():
    inner = json.loads((FIXTURES / "deepseek_v32_tiny.json").read_text())
    model = spec_from_hf_config({"model_type": "some_vlm", "text_config": inner})
    assert len(model.layers) == 4


def test_config_errors_name_the_problem(tmp_path):
    config = json.loads((FIXTURES / "deepseek_v32_tiny.json").read_text())
    with pytest.raises(ConfigError, match="index_topk"):
        spec_from_hf_config({k: v for k, v in config.items() if k != "index_topk"})
    with pytest.raises(ConfigError, match="latent formats store 576"):
        spec_from_hf_config({**config, "kv_lora_rank": 256})
    with pytest.raises(ConfigError, match="DeepseekV32ForCausalLM"):
        spec_from_hf_config({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        load_hf_config(tmp_path)


def test_unknown_model_lists_known_names():
    with pytest.raises(UnknownModelError) as err:
        get_model("kimi-k4")
    for name in MODELS:
        assert name in str(err.value)
