import pytest

from hwrun.kv.errors import PlanError
from hwrun.kv.footprint import footprint
from hwrun.models import get_model

# (model, latent, index, latent B, index B, total B) per token per GPU at TP8, from the seeds
SEED_FIGURES = [
    ("kimi-k3", None, None, 13824, 0, 13824),
    ("kimi-k3.1-pro", None, None, 13824, 3168, 16992),
    ("kimi-k3.1-pro", "nvfp4_ds_mla", "mxfp4", 8448, 1632, 10080),
    ("mistral-large-4", None, None, 41328, 5808, 47136),
    ("mistral-large-4", "fp8_e4m3", None, 36288, 5808, 42096),
    ("mistral-large-4", "bf16", None, 72576, 5808, 78384),
]


@pytest.mark.parametrize(("name", "latent", "index", "lat", "idx", "total"), SEED_FIGURES)
def test_seed_bytes_per_token_come_from_the_layer_specs(name, latent, index, lat, idx, total):
    model = get_model(name).with_formats(latent=latent, index=index)
    per_token = footprint(model, tp=8).per_global_token()
    assert per_token == {"latent": lat, "index_keys": idx, "total": total}


def test_rocm_e4m3_cache_holds_1_86x_of_bf16():
    model = get_model("mistral-large-4")
    bf16 = footprint(model.with_formats(latent="bf16"), tp=8).bytes_per_token
    e4m3 = footprint(model.with_formats(latent="fp8_e4m3"), tp=8).bytes_per_token
    assert round(bf16 / e4m3, 2) == 1.86


def test_tp_replicates_and_dcp_shards_by_token():
    model = get_model("kimi-k3.1-pro")
    tp1, tp8, dcp8 = footprint(model, 1), footprint(model, 8), footprint(model, 8, 8)
    assert tp1.bytes_per_token == tp8.bytes_per_token == dcp8.bytes_per_token
    assert dcp8.per_global_token()["total"] == 16992 // 8
    # KDA state is split by head under TP, the same with or without DCP
    assert tp1.kda_bytes_per_request == 8 * tp8.kda_bytes_per_request
    assert dcp8.kda_bytes_per_request == tp8.kda_bytes_per_request


def test_consumers_and_sharers_own_nothing():
    fp = footprint(get_model("mistral-large-4"), tp=8)
    assert (fp.latent_layers, fp.index_layers) == (63, 44)


def test_every_reason_is_listed_at_once():
    model = get_model("kimi-k3.1-pro").with_formats(latent="fp7", index="int2")
    with pytest.raises(PlanError) as err:
        footprint(model, tp=5, dcp=2)
    text = str(err.value)
    assert "DCP size 2 must divide the TP size 5" in text
    assert "96 KDA heads do not divide over TP 5" in text
    assert "fp7" in text and "int2" in text
    assert len(err.value.reasons) == 4
