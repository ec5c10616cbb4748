"""The streaming MoE loader: bytes as moe.requant makes them, peak memory bounded as the seeds
state (MXFP4 model + one layer's FP8 experts), and bad checkpoints refused before any data."""

from pathlib import Path

import pytest
import torch

from hwrun.checkpoint import (
    CheckpointError,
    MoECheckpointConfig,
    SafetensorsCheckpoint,
    load_moe_layers,
)
from hwrun.ops.moe_experts import experts
from hwrun.ops.moe_requant import requant, requant_matrix_to_mxfp4
from hwrun.ops.moe_route import route
from hwrun.ops.quantized_weight import QuantizedWeight, quantize_weight

from .synthetic import write_checkpoint
from .torch_memory import cuda_memory, torch_cpu_memory

CONFIG = MoECheckpointConfig(
    moe_layers=(1, 2, 3),
    num_experts=8,
    hidden_size=256,
    moe_intermediate_size=128,
    shared_intermediate_size=128,
)
# Slack: the transient of converting one expert matrix (its fp32 decode, its bf16 copy and the
# MXFP4 quantizer's temporaries), measured on its own with the same counters, so the bound
# follows the codecs' internals and checks only the loader's streaming. It is 5.7 fp32 copies
# of the matrix with today's codecs, below one FP8 layer here (6): a loader that keeps a second
# FP8 layer, or decodes a whole layer at once, exceeds the bound.


def conversion_slack(config: MoECheckpointConfig, measure, device: str = "cpu") -> int:
    """Peak bytes of converting the largest expert matrix alone on ``device``, by ``measure``."""
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(config.moe_intermediate_size, config.hidden_size, generator=generator)
    fp8 = quantize_weight(weight * 0.02, "fp8_block128")
    device_fp8 = (fp8.data.to(device), fp8.scales.to(device))
    with measure() as memory:
        requant_matrix_to_mxfp4(*device_fp8)
    return memory.peak


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, dict]:
    directory = tmp_path_factory.mktemp("moe_fp8")
    return directory, write_checkpoint(directory, CONFIG)


def stacked_fp8(written, layer, projs):
    """The layer's FP8 experts of ``projs`` as one [E, rows, C] fp8_block128 weight."""
    per_expert = [
        [written[f"{CONFIG.experts_prefix(layer)}.{e}.{p}"] for p in projs]
        for e in range(CONFIG.num_experts)
    ]
    data = torch.stack([torch.cat([w.data for w in ws]) for ws in per_expert])
    scales = torch.stack([torch.cat([w.scales for w in ws]) for ws in per_expert])
    return QuantizedWeight("fp8_block128", tuple(data.shape), data, scales)


def one_fp8_layer_bytes(path: Path) -> int:
    entries = SafetensorsCheckpoint(path).entries
    prefix = CONFIG.experts_prefix(CONFIG.moe_layers[0]) + "."
    return sum(entry.nbytes for name, entry in entries.items() if name.startswith(prefix))


def test_experts_are_moe_requant_of_the_stored_fp8(checkpoint):
    path, written = checkpoint
    model = load_moe_layers(path, CONFIG)
    assert sorted(model.layers) == [1, 2, 3]
    for layer, weights in model.layers.items():
        w13 = requant(stacked_fp8(written, layer, ("gate_proj", "up_proj")))
        w2 = requant(stacked_fp8(written, layer, ("down_proj",)))
        assert weights.w13.format == weights.w2.format == "mxfp4"
        assert weights.w13.shape == (8, 256, 256) and weights.w2.shape == (8, 256, 128)
        assert torch.equal(weights.w13.data, w13.data) and torch.equal(
            weights.w13.scales, w13.scales
        )
        assert torch.equal(weights.w2.data, w2.data) and torch.equal(weights.w2.scales, w2.scales)
        assert torch.equal(weights.router_weight, written[CONFIG.router_name(layer, "weight")])
        bias = written[CONFIG.router_name(layer, "e_score_correction_bias")]
        assert torch.equal(weights.e_score_correction_bias, bias)
        shared13, shared2 = weights.shared_experts
        gate, up = (written[f"{CONFIG.shared_prefix(layer)}.{p}"] for p in ("gate_proj", "up_proj"))
        assert shared13.format == "bf16" and torch.equal(shared13.data, torch.cat([gate, up]))
        assert torch.equal(shared2.data, written[f"{CONFIG.shared_prefix(layer)}.down_proj"])


def test_peak_memory_is_the_mxfp4_model_plus_one_fp8_layer(checkpoint):
    path, _ = checkpoint
    with torch_cpu_memory() as memory:
        model = load_moe_layers(path, CONFIG)
    bound = model.nbytes + one_fp8_layer_bytes(path) + conversion_slack(CONFIG, torch_cpu_memory)
    assert memory.peak <= bound, f"peak {memory.peak} B > bound {bound} B"
    # The counters see the model itself, and nothing of the FP8 copies is left at the end.
    assert model.nbytes <= memory.net <= model.nbytes + 1024


def test_the_memory_bound_catches_a_loader_that_keeps_every_fp8_layer(checkpoint):
    """The same bound fails for a loader that reads all FP8 experts before converting."""
    path, _ = checkpoint
    reader = SafetensorsCheckpoint(path)
    with torch_cpu_memory() as memory:
        everything = [reader.read(name) for name in reader.entries if ".experts." in name]
        model = load_moe_layers(path, CONFIG)
    bound = model.nbytes + one_fp8_layer_bytes(path) + conversion_slack(CONFIG, torch_cpu_memory)
    assert memory.peak > bound
    del everything


def test_fp8_experts_can_be_kept_and_fp8_shared_experts_stay_fp8(tmp_path):
    written = write_checkpoint(tmp_path, CONFIG, shared_fp8=True, files=1)
    model = load_moe_layers(tmp_path, CONFIG, expert_format="fp8_block128")
    layer = model.layers[2]
    expected = stacked_fp8(written, 2, ("gate_proj", "up_proj"))
    assert layer.w13.format == "fp8_block128"
    assert torch.equal(layer.w13.data, expected.data) and torch.equal(
        layer.w13.scales, expected.scales
    )
    shared13, shared2 = layer.shared_experts
    assert shared13.format == shared2.format == "fp8_block128" and shared13.shape == (256, 256)
    down = written[f"{CONFIG.shared_prefix(2)}.down_proj"]
    assert torch.equal(shared2.data, down.data) and torch.equal(shared2.scales, down.scales)


def edit_checkpoint(path: Path, edit) -> None:
    """Rewrite every file of the checkpoint after ``edit(tensors)`` changed its dict."""
    from safetensors.torch import load_file, save_file

    for file in sorted(path.glob("*.safetensors")):
        tensors = load_file(file)
        edit(tensors)
        save_file(tensors, file)


def refuse(path: Path, monkeypatch) -> str:
    """Load, expecting a refusal before any tensor data is read; return the message."""
    reads = []
    original = SafetensorsCheckpoint.read
    monkeypatch.setattr(
        SafetensorsCheckpoint,
        "read",
        lambda self, name, *args: reads.append(name) or original(self, name, *args),
    )
    with pytest.raises(CheckpointError) as err:
        load_moe_layers(path, CONFIG)
    assert reads == []
    return str(err.value)


def test_missing_and_misshaped_tensors_are_all_named_before_any_data_is_read(tmp_path, monkeypatch):
    write_checkpoint(tmp_path, CONFIG)
    scale = "model.layers.3.mlp.experts.7.down_proj.weight_scale_inv"
    up = "model.layers.2.mlp.experts.5.up_proj.weight"
    router = "model.layers.1.mlp.gate.weight"

    def damage(tensors):
        tensors.pop(scale, None)
        if up in tensors:
            tensors[up] = tensors[up][:, :224].contiguous()
        if router in tensors:
            tensors[router] = tensors[router].to(torch.float16)

    edit_checkpoint(tmp_path, damage)
    message = refuse(tmp_path, monkeypatch)
    assert "(3 problems)" in message
    assert f"{scale}: missing (expected F32 [2, 1])" in message
    assert f"{up}: expected F8_E4M3 [128, 256], got F8_E4M3 [128, 224]" in message
    assert f"{router}: expected F32/BF16 [8, 256], got F16 [8, 256]" in message


def test_a_config_the_checkpoint_does_not_hold_is_refused(checkpoint, monkeypatch):
    path, _ = checkpoint
    more_experts = MoECheckpointConfig(**{**CONFIG.__dict__, "num_experts": 9})
    with pytest.raises(
        CheckpointError,
        match=r"layers\.1\.mlp\.gate\.weight: expected F32/BF16 "
        r"\[9, 256\], got F32 \[8, 256\]",
    ):
        load_moe_layers(path, more_experts)
    with pytest.raises(CheckpointError, match="expert_format must be one of"):
        load_moe_layers(path, CONFIG, expert_format="nvfp4")
    odd = MoECheckpointConfig(**{**CONFIG.__dict__, "moe_intermediate_size": 96})
    with pytest.raises(CheckpointError, match="moe_intermediate_size must be a multiple of 128"):
        load_moe_layers(path, odd, expert_format="fp8_block128")


def test_broken_files_are_refused_naming_the_file_or_tensor(tmp_path):
    write_checkpoint(tmp_path, CONFIG, files=1)
    file = next(tmp_path.glob("*.safetensors"))
    file.write_bytes(file.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"tensor '.*' in .*: F\w+ \[.*\] needs \d+ bytes"):
        load_moe_layers(tmp_path, CONFIG)
    with pytest.raises(CheckpointError, match="neither a file nor a directory"):
        load_moe_layers(tmp_path / "absent", CONFIG)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"has no \*\.safetensors file"):
        load_moe_layers(empty, CONFIG)


def test_a_tensor_stored_twice_is_refused(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(2)}, tmp_path / "one.safetensors")
    save_file({"a": torch.zeros(2)}, tmp_path / "two.safetensors")
    with pytest.raises(
        CheckpointError, match=r"'a' is in both one\.safetensors and two\.safetensors"
    ):
        SafetensorsCheckpoint(tmp_path)


def test_config_from_a_deepseek_config_json():
    config = MoECheckpointConfig.from_hf_config(
        {
            "num_hidden_layers": 61,
            "first_k_dense_replace": 3,
            "moe_layer_freq": 1,
            "n_routed_experts": 256,
            "hidden_size": 7168,
            "moe_intermediate_size": 2048,
            "n_shared_experts": 1,
            "topk_method": "noaux_tc",
        }
    )
    assert config.moe_layers == tuple(range(3, 61))
    assert (config.num_experts, config.shared_intermediate_size) == (256, 2048)
    assert config.has_correction_bias


@pytest.mark.skipif(not torch.cuda.is_available(), reason="measures a CUDA device's allocator")
def test_cuda_peak_is_the_mxfp4_model_plus_one_fp8_layer_and_bytes_match_cpu(tmp_path):
    """On a GPU the bound is read from the CUDA caching allocator's own peak counter, at a
    size where one FP8 layer (24 MiB) dwarfs the slack; the bytes equal the CPU load's."""
    config = MoECheckpointConfig(
        moe_layers=(0, 1, 2, 3),
        num_experts=16,
        hidden_size=1024,
        moe_intermediate_size=512,
        shared_intermediate_size=512,
    )
    write_checkpoint(tmp_path, config, files=4)
    with cuda_memory() as memory:
        model = load_moe_layers(tmp_path, config, device="cuda")
    peak = memory.peak
    one_layer = sum(
        entry.nbytes
        for name, entry in SafetensorsCheckpoint(tmp_path).entries.items()
        if name.startswith(config.experts_prefix(0) + ".")
    )
    assert peak <= model.nbytes + one_layer + conversion_slack(config, cuda_memory, "cuda")
    assert model.layers[3].w13.data.is_cuda
    on_cpu = load_moe_layers(tmp_path, config).layers[3]
    assert torch.equal(model.layers[3].w13.data.cpu(), on_cpu.w13.data)
    assert torch.equal(model.layers[3].w2.scales.cpu(), on_cpu.w2.scales)


def test_a_loaded_layer_serves_the_moe_block_close_to_its_fp8_weights(checkpoint):
    """The ROCm path end to end: route, then MXFP4 experts with fp8 activations (a8w4),
    against the same layer served from its stored FP8 experts with bf16 activations."""
    path, _ = checkpoint
    mxfp4 = load_moe_layers(path, CONFIG).layers[2]
    fp8 = load_moe_layers(path, CONFIG, expert_format="fp8_block128").layers[2]
    x = torch.randn(16, CONFIG.hidden_size, generator=torch.Generator().manual_seed(3))
    logits = x @ mxfp4.router_weight.T
    weights, ids = route(logits, 4, "sigmoid", 4, 2, mxfp4.e_score_correction_bias)
    x = x.bfloat16()
    served = experts(x, mxfp4.w13, mxfp4.w2, ids, weights, "a8w4", mxfp4.shared_experts)
    stored = experts(x, fp8.w13, fp8.w2, ids, weights, "bf16", fp8.shared_experts)
    error = ((served.float() - stored.float()).norm() / stored.float().norm()).item()
    assert 0.01 < error < 0.25  # MXFP4 weights and fp8 activations: the a8w4 tests' class
