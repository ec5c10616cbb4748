"""config.json checks of the engine: every problem named at once, clear refusals, the RoPE tables
against transformers' own."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DeepseekV32Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from hwrun.checkpoint.safetensors_reader import CheckpointError
from hwrun.engine.model_config import ConfigError, load_model_config, parse_model_config
from hwrun.engine.rope import inverse_frequencies
from hwrun.engine.weights import load_weights
from hwrun.errors import UsageError
from tests.engine.tiny_checkpoints import build_tiny_model, tiny_config

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


def _valid() -> dict:
    return tiny_config().to_dict()


def test_a_transformers_config_parses():
    config = parse_model_config(_valid())
    assert config.num_layers == 2 and config.moe_layers == (False, True)
    assert config.index_topk == 16 and config.eos_token_ids == (1,)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"num_hidden_layers": "2"}, "num_hidden_layers must be an integer, got '2'"),
        ({"num_hidden_layers": 2.0}, "num_hidden_layers must be an integer, got 2.0"),
        ({"num_hidden_layers": True}, "num_hidden_layers must be an integer, got True"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be >= 1"),
        ({"num_hidden_layers": 10**9}, "num_hidden_layers must be >= 1 and <= 1024"),
        ({"kv_lora_rank": 256}, "kv_lora_rank must be 512"),
        ({"index_head_dim": 64}, "index_head_dim must be 128"),
        ({"hidden_act": "gelu"}, "hidden_act must be 'silu'"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 exceeds n_routed_experts 8"),
        ({"n_group": 3}, "n_routed_experts 8 must be a multiple of n_group 3"),
        ({"rms_norm_eps": -1}, "rms_norm_eps must be a positive finite number"),
        ({"eos_token_id": "x"}, "eos_token_id must be a token id"),
        ({"rope_parameters": {"rope_type": "longrope"}}, "rope_type 'longrope' is not supported"),
        ({"mlp_layer_types": ["dense"]}, "mlp_layer_types must list 'dense' or 'sparse'"),
        ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "the engine runs"),
        (
            {"quantization_config": {"scale_fmt": "e5m2"}},
            "quantization_config.scale_fmt must be 'ue8m0' or absent",
        ),
    ],
)
def test_each_bad_field_is_named(change, reason):
    raw = {**_valid(), **change}
    with pytest.raises(ConfigError) as err:
        parse_model_config(raw)
    assert any(reason in r for r in err.value.reasons), err.value.reasons
    assert isinstance(err.value, UsageError)


def test_the_fp8_scale_format_is_read_from_the_quantization_config():
    assert parse_model_config(_valid()).fp8_scale_fmt is None
    ue8m0 = {"quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
    assert parse_model_config({**_valid(), "quantization_config": ue8m0}).fp8_scale_fmt == "ue8m0"


def test_every_missing_field_is_listed_at_once():
    raw = _valid()
    for key in ("vocab_size", "hidden_size", "q_lora_rank"):
        del raw[key]
    with pytest.raises(ConfigError) as err:
        parse_model_config(raw)
    assert {f"{key} is missing" for key in ("vocab_size", "hidden_size", "q_lora_rank")} <= set(
        err.value.reasons
    )


def test_not_an_object_and_not_json(tmp_path):
    with pytest.raises(ConfigError, match="expected a JSON object"):
        parse_model_config([1, 2])
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read it as JSON"):
        load_model_config(tmp_path)


def test_deepseek_style_rope_scaling_is_read():
    raw = {**_valid(), "rope_scaling": {"type": "yarn", **YARN}, "rope_theta": 10000.0}
    del raw["rope_parameters"]
    rope = parse_model_config(raw).rope
    assert rope.kind == "yarn" and rope.factor == 40.0 and rope.mscale_all_dim == 1.0


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 50000.0}, YARN])
def test_rope_frequencies_equal_transformers(rope):
    config = parse_model_config({**_valid(), "rope_parameters": rope})
    ours, scaling = inverse_frequencies(config.rope)
    hf = DeepseekV32Config(
        **{**_valid(), "rope_parameters": rope, "max_position_embeddings": 163840}
    )
    kind = rope["rope_type"]
    if kind == "default":
        theirs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, 64, 2).float() / 64))
        their_scaling = 1.0
    else:
        theirs, their_scaling = ROPE_INIT_FUNCTIONS[kind](hf)
    torch.testing.assert_close(ours, theirs.float(), rtol=0, atol=0)
    assert scaling == pytest.approx(their_scaling)


def test_a_checkpoint_that_does_not_fit_its_config_lists_every_tensor(tmp_path):
    build_tiny_model(tmp_path, seed=1)
    config = json.loads((tmp_path / "config.json").read_text())
    config["hidden_size"] = 96  # every hidden-sized tensor now has the wrong shape
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        load_weights(tmp_path, load_model_config(tmp_path), "cpu", torch.float32)
    message = str(err.value)
    assert "model.embed_tokens.weight: shape [128, 64], expected [128, 96]" in message
    assert "and" in message and "more" in message  # past the first 20, counted


def test_the_runner_refuses_a_chunk_it_cannot_place(tmp_path):
    from hwrun.engine.batch import ScheduledChunk
    from hwrun.engine.config import EngineConfig
    from hwrun.engine.model_runner import build_model_runner

    build_tiny_model(tmp_path, seed=2)
    runner = build_model_runner(
        EngineConfig(model=str(tmp_path), platform="reference", num_kv_tokens=8 * 64)
    )
    bad = [
        (ScheduledChunk(0, [5] * 70, 0, [1], True), "need 2 valid blocks"),  # table too short
        (ScheduledChunk(0, [5], 64, [1, 9], True), "need 2 valid blocks"),  # block 9 of 8
        (ScheduledChunk(0, [5, 500], 0, [1], True), "outside the vocabulary"),
        (ScheduledChunk(0, [5], 512, [0] * 8, True), "past max_model_len"),
    ]
    for chunk, reason in bad:
        with pytest.raises(ValueError, match=reason):
            runner.execute([chunk])
