"""Block-FP8 projections stay FP8 in the engine: loaded as QuantizedWeights, run through the
resolved ``dense.linear`` op, decoded once at startup only where the reference serves it in an
fp32 engine (the CPU), and split by tensor parallelism on whole scale tiles only.

The last test needs a CUDA GPU (skipped in CI): the NVIDIA platform's Triton ``dense.linear``
on the stored codes against the GPU reference run, eager and replayed from CUDA graphs.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from hwrun.engine.batch import ScheduledChunk
from hwrun.engine.linears import Linear, bind_linears, quantized_linear_formats
from hwrun.engine.model_config import load_model_config
from hwrun.engine.op_table import EngineStartupError, OpTable
from hwrun.engine.tensor_parallel import _cols, _rows, tp_reasons
from hwrun.engine.weights import load_weights
from hwrun.formats.fp8 import dequantize_fp8_block128
from hwrun.ops.linear import linear as reference_linear
from hwrun.ops.linear import linear_a8w8 as reference_a8w8
from hwrun.ops.quantized_weight import QuantizedWeight, quantize_weight
from hwrun.registry import OpImpl, Selection
from tests.engine.test_engine_gpu import (  # the GPU engine test's helpers and platform
    DECODE_FROM,
    GPU_MODEL,
    MEDIAN_REL,
    PROMPT,
    _logits,
    _prompt,
    _relative_row_errors,
    _runner,
    plugins,  # noqa: F401 (fixture)
)
from tests.engine.tiny_checkpoints import build_tiny_model

ATTN = "model.layers.0.self_attn."


@pytest.fixture(scope="module")
def fp8_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("fp8-linears")
    return build_tiny_model(path, seed=3, weights="fp8", moe_intermediate_size=128)


def _linears(weights) -> dict[str, Linear]:
    a = weights.layers[0].attention
    return {
        "q_a_proj": a.q_a_proj,
        "q_b_proj": a.q_b_proj,
        "o_proj": a.o_proj,
        "gate_proj": weights.layers[0].mlp.gate_proj,
        "down_proj": weights.layers[0].mlp.down_proj,
    }


def _table(fn, platform: str = "fake") -> OpTable:
    impl = OpImpl(op="dense.linear", name="fake", platform=platform, fn=fn)
    return OpTable({"dense.linear": Selection(impl, fallback=False)})


def test_block_fp8_projections_load_as_stored(fp8_model):
    config = load_model_config(fp8_model.path)
    weights = load_weights(fp8_model.path, config, "cpu", torch.bfloat16)
    stored = load_file(fp8_model.path / "model.safetensors")
    q_a = weights.layers[0].attention.q_a_proj.weight
    assert isinstance(q_a, QuantizedWeight) and q_a.format == "fp8_block128"
    assert torch.equal(q_a.data, stored[ATTN + "q_a_proj.weight"].view(torch.uint8))
    assert torch.equal(q_a.scales, stored[ATTN + "q_a_proj.weight_scale_inv"])
    assert all(isinstance(lin.weight, QuantizedWeight) for lin in _linears(weights).values())
    # What the checkpoint stores in bf16 stays a tensor (this one's kv_a_proj_with_mqa and
    # indexer wq_b / wk);
    # weights_proj is fp32 as transformers keeps it; the LM head and W_UK / W_UV are tensors.
    assert weights.layers[0].attention.kv_a_proj.weight.dtype == torch.bfloat16
    assert weights.layers[0].attention.indexer.weights_proj.weight.dtype == torch.float32
    assert isinstance(weights.lm_head.weight, torch.Tensor)
    assert weights.layers[0].attention.w_uk.dtype == torch.bfloat16
    assert quantized_linear_formats(weights) == ("fp8_block128",)


def test_an_unbound_fp8_linear_says_what_is_missing(fp8_model):
    weights = load_weights(fp8_model.path, load_model_config(fp8_model.path), "cpu", torch.float32)
    with pytest.raises(RuntimeError, match=r"runs through the engine's dense.linear op.*bind"):
        weights.layers[0].attention.q_a_proj(torch.zeros(2, 64))


def test_bound_linears_call_the_resolved_op_at_every_call(fp8_model):
    config = load_model_config(fp8_model.path)
    weights = load_weights(fp8_model.path, config, "cpu", torch.bfloat16)
    calls = []

    def op(x, weight):
        calls.append(weight.name)
        return reference_linear(x, weight)

    table = _table(op)
    bound = bind_linears(weights, table, torch.bfloat16)
    q_a = bound.layers[0].attention.q_a_proj
    assert q_a.weight is weights.layers[0].attention.q_a_proj.weight  # still FP8, not copied
    x = torch.randn(3, 2, 64).to(torch.bfloat16)  # leading dims are flattened and restored
    got = q_a(x, row_by_row=True)
    assert got.shape == (3, 2, 32) and calls == [ATTN + "q_a_proj.weight"]
    assert torch.equal(got.view(6, 32), reference_linear(x.view(6, 64), q_a.weight))
    with table.replaced({"dense.linear": lambda x, w: torch.zeros(x.shape[0], w.shape[0])}):
        assert not q_a(x).any()  # a replacement in the table reaches the bound linear


def test_the_cpu_reference_decodes_each_weight_once_at_startup(plugins, fp8_model):  # noqa: F811
    # The plugins fixture, not load_plugins(): the GPU machine runs the tree uninstalled, where
    # only HWRUN_DISABLE_ENTRY_POINTS (which the tests' conftest clears) builds the reference in.
    runner = _runner(plugins, model=str(fp8_model.path), platform="reference", num_kv_tokens=8 * 64)
    served = {c.op: c.platform for c in runner.op_table}
    assert served["dense.linear"] == "reference"
    loaded = load_weights(fp8_model.path, runner.model_config, "cpu", torch.float32)
    for name, linear in _linears(runner.model.weights).items():
        want = _linears(loaded)[name].weight.dequantize()
        assert isinstance(linear.weight, torch.Tensor) and torch.equal(linear.weight, want), name
    logits = runner.execute([ScheduledChunk(0, [5, 9, 11], 0, [1], True)])[0].logits
    assert logits.shape == (1, 128) and torch.isfinite(logits).all()


# Every block-FP8 linear's input 128 columns wide (hidden, q-LoRA, heads x v, dense MLP width),
# as dense.linear_a8w8 quantizes activations in groups of 128.
A8W8_READY = dict(
    hidden_size=128, q_lora_rank=128, intermediate_size=128, moe_intermediate_size=128
)


@pytest.fixture(scope="module")
def a8w8_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("a8w8"), seed=7, weights="fp8", **A8W8_READY)


def test_fp8_activations_run_the_a8w8_op(plugins, a8w8_model):  # noqa: F811
    """--linear-activation-dtype fp8: the block-FP8 linears go through dense.linear_a8w8 (on the
    CPU reference: decoded once, x quantized as the op defines), and the logits move by the
    activations' rounding only."""
    flags = dict(model=str(a8w8_model.path), platform="reference", num_kv_tokens=8 * 64)
    a8w8 = _runner(plugins, linear_activation_dtype="fp8", **flags)
    served = {c.op for c in a8w8.op_table}
    assert "dense.linear_a8w8" in served and "dense.linear" not in served
    q_a = a8w8.model.weights.layers[0].attention.q_a_proj
    stored = load_weights(a8w8_model.path, a8w8.model_config, "cpu", torch.float32)
    weight = stored.layers[0].attention.q_a_proj.weight
    assert q_a.activations_of == weight.format
    x = torch.randn(5, weight.shape[1], generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(q_a(x), reference_a8w8(x, weight), rtol=1e-5, atol=1e-6)

    chunk = [ScheduledChunk(0, [5, 9, 11, 3, 7], 0, [1], True)]
    got = a8w8.execute(chunk)[0].logits
    want = _runner(plugins, **flags).execute(chunk)[0].logits
    assert torch.isfinite(got).all() and not torch.equal(got, want)
    # e4m3 activations (3 mantissa bits) through 2 layers of the tiny model: a few percent
    assert _relative_row_errors(got, want).max().item() < 0.1


def _with_scale_fmt(path, powers_of_two: bool) -> None:
    """The checkpoint at ``path`` declaring ``scale_fmt: ue8m0``, its block scales rounded up to
    powers of two (DeepSeek-V3.1 and later store them so) or left as they are."""
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "scale_fmt": "ue8m0"}
    (path / "config.json").write_text(json.dumps(config))
    if powers_of_two:
        file = path / "model.safetensors"
        tensors = load_file(file)
        for name, tensor in tensors.items():
            if name.endswith("weight_scale_inv"):
                tensors[name] = torch.exp2(torch.ceil(torch.log2(tensor)))
        save_file(tensors, file, metadata={"format": "pt"})


def test_ue8m0_checkpoints_keep_their_power_of_two_scales_as_e8m0(plugins, tmp_path):  # noqa: F811
    """scale_fmt ue8m0: linears whose scales are powers of two load as fp8_block128_ue8m0 (the
    same decoded values), so dense.linear_a8w8 rounds the activations' scales up to powers of
    two, as DeepSeek's inference code does; other scales stay fp32 (fp8_block128)."""
    pow2, plain = tmp_path / "pow2", tmp_path / "plain"
    for path, powers in ((pow2, True), (plain, False)):
        build_tiny_model(path, seed=7, weights="fp8", **A8W8_READY)
        _with_scale_fmt(path, powers)
    stored = load_file(pow2 / "model.safetensors")
    config = load_model_config(pow2)
    assert config.fp8_scale_fmt == "ue8m0"
    q_a = load_weights(pow2, config, "cpu", torch.float32).layers[0].attention.q_a_proj.weight
    assert q_a.format == "fp8_block128_ue8m0" and q_a.scales.dtype == torch.uint8
    name = ATTN + "q_a_proj.weight"
    decoded = dequantize_fp8_block128(
        stored[name].view(torch.uint8), stored[name.removesuffix("weight") + "weight_scale_inv"]
    )
    assert torch.equal(q_a.dequantize(), decoded)
    kept = load_weights(plain, load_model_config(plain), "cpu", torch.float32)
    assert kept.layers[0].attention.q_a_proj.weight.format == "fp8_block128"

    runner = _runner(
        plugins, model=str(pow2), platform="reference", num_kv_tokens=8 * 64,
        linear_activation_dtype="fp8",
    )  # fmt: skip
    linear = runner.model.weights.layers[0].attention.q_a_proj
    assert linear.activations_of == "fp8_block128_ue8m0"
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(linear(x), reference_a8w8(x, q_a), rtol=1e-5, atol=1e-6)
    scales = torch.exp2(q_a.scales.float() - 127)  # the same powers of two, as fp32
    fp32_scales = QuantizedWeight("fp8_block128", q_a.shape, q_a.data, scales)
    assert not torch.equal(reference_a8w8(x, q_a), reference_a8w8(x, fp32_scales))


def test_fp8_activations_refuse_inputs_not_in_groups_of_128(plugins, fp8_model):  # noqa: F811
    with pytest.raises(EngineStartupError) as err:
        _runner(plugins, model=str(fp8_model.path), platform="reference", num_kv_tokens=8 * 64,
                linear_activation_dtype="fp8")  # fmt: skip
    reasons = " | ".join(err.value.reasons)
    assert "q_a_proj.weight (fp8_block128, 64 columns)" in reasons
    assert "use --linear-activation-dtype bf16" in reasons


def test_a_bf16_checkpoint_needs_no_dense_linear(plugins, tmp_path):  # noqa: F811
    build_tiny_model(tmp_path, seed=4)
    runner = _runner(plugins, model=str(tmp_path), platform="reference", num_kv_tokens=8 * 64)
    assert "dense.linear" not in {c.op for c in runner.op_table}


def test_tensor_parallel_splits_fp8_projections_on_whole_tiles_only(fp8_model):
    config = load_model_config(fp8_model.path)  # 4 heads of qk 96 / v 32, dense width 64
    reasons = " | ".join(tp_reasons(config, 2, "bf16", ("fp8_block128",)))
    assert "q_b_proj rows (heads x qk_head_dim) to be a multiple of 128" in reasons
    assert "got 192" in reasons and "o_proj columns" in reasons and "dense MLP width" in reasons
    assert tp_reasons(config, 2, "bf16") == []  # the same split with bf16 projections
    aligned = replace(config, qk_nope_head_dim=64, v_head_dim=128, intermediate_size=512)
    assert tp_reasons(aligned, 2, "bf16", ("fp8_block128",)) == []

    g = torch.Generator().manual_seed(5)
    weight = quantize_weight(torch.randn(256, 384, generator=g), "fp8_block128", "w")
    full = weight.dequantize()
    rows = _rows(Linear(weight), slice(128, 256)).weight
    cols = _cols(Linear(weight), slice(128, 256)).weight
    assert rows.shape == (128, 384) and torch.equal(rows.dequantize(), full[128:])
    assert cols.shape == (256, 128) and torch.equal(cols.dequantize(), full[:, 128:256])


@pytest.fixture(scope="module")
def gpu_fp8_model(tmp_path_factory):
    """test_engine_gpu.py's model (16 heads and index heads, for the Triton attention kernels)
    with block-FP8 projections and experts, as DeepSeek ships them."""
    path = tmp_path_factory.mktemp("gpu-fp8-model")
    return build_tiny_model(path, seed=22, weights="fp8", moe_intermediate_size=128, **GPU_MODEL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_block_fp8_projections_stay_fp8_on_the_gpu(plugins, gpu_fp8_model):  # noqa: F811
    """dense.linear on the stored e4m3 codes (Triton), against the GPU reference run (whose
    dense.linear decodes them per call), in eager decode and in CUDA-graph decode."""
    prompt = _prompt(gpu_fp8_model.config.vocab_size)
    flags = dict(model=str(gpu_fp8_model.path), num_kv_tokens=16 * 64, max_model_len=1024)
    flags |= dict(kv_cache_dtype="fp8_ds_mla", index_dtype="fp8")
    gpu = _runner(plugins, platform="nvidia", cuda_graphs=False, **flags)
    served = {c.op: f"{c.platform}:{c.impl}" for c in gpu.op_table}
    print(f"fp8 projections: {served}")
    assert served["dense.linear"] == "nvidia:triton"
    q_a = gpu.model.weights.layers[0].attention.q_a_proj.weight
    assert isinstance(q_a, QuantizedWeight) and q_a.format == "fp8_block128"
    assert q_a.device.type == "cuda"
    reference = _runner(plugins, platform="reference", device="cuda", cuda_graphs=False, **flags)
    want = _logits(reference, prompt, [4, 9, 2])
    errors = _relative_row_errors(_logits(gpu, prompt, [4, 9, 2]), want)
    print(f"fp8 projections, nvidia vs GPU reference: median {errors.median():.2e}")
    assert errors.median().item() < MEDIAN_REL
    graphed = _runner(plugins, platform="nvidia", max_num_seqs=8, **flags)
    assert graphed.graphs is not None, graphed.cuda_graphs_status
    replayed = _relative_row_errors(
        _logits(graphed, prompt, [3, 8, 11]), _logits(gpu, prompt, [3, 8, 11])
    )
    assert replayed.max().item() < 0.02


@pytest.fixture(scope="module")
def gpu_a8w8_model(tmp_path_factory):
    """v_head_dim 128: o_proj's input is one 128-column group a head, so under
    HWRUN_NORM_QUANTIZE the W_UV product writes its codes (the tiny default of 32 would leave
    o_proj to the quantizer and the test below would not see that path)."""
    path = tmp_path_factory.mktemp("gpu-a8w8-model")
    shape = GPU_MODEL | A8W8_READY | dict(v_head_dim=128)
    return build_tiny_model(path, seed=23, weights="fp8", **shape)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("norm_quantize", [False, True], ids=["quantizer", "norm_quantize"])
def test_a8w8_linears_on_the_gpu(plugins, gpu_a8w8_model, norm_quantize, monkeypatch):  # noqa: F811
    """Every dense.linear_a8w8 call of a teacher-forced GPU run (prefill and decode rows, the
    engine's own strides and joined projections) against the reference op on the same input.
    With HWRUN_NORM_QUANTIZE the norms ahead of the joined projections, the dense MLP and (the
    experts are a8w8 too) each MoE, and the W_UV product ahead of o_proj, hand their output's
    codes and scales over: each must be byte-exact to x's quantization, and moe.experts' output
    the one it computes from x.

    Not compared: the logits against the GPU reference run. With e4m3 activations a difference
    of one bf16 unit upstream (any op's summation order) flips an activation's code, one part in
    16, and the tiny random model amplifies it: on the H200 the median row error was 0.28 with
    any single op, this one included, put back on the reference (0.056 with bf16 activations).
    """
    from hwrun.formats.fp8 import quantize_fp8_groups

    monkeypatch.setenv("HWRUN_NORM_QUANTIZE", "1" if norm_quantize else "0")
    prompt = _prompt(gpu_a8w8_model.config.vocab_size)
    flags = dict(model=str(gpu_a8w8_model.path), num_kv_tokens=16 * 64, max_model_len=1024)
    flags |= dict(kv_cache_dtype="fp8_ds_mla", index_dtype="fp8", linear_activation_dtype="fp8")
    flags |= dict(expert_activation_dtype="fp8")
    gpu = _runner(plugins, platform="nvidia", cuda_graphs=False, **flags)
    assert gpu.model.norm_quantize == norm_quantize
    choice = next(c for c in gpu.op_table if c.op == "dense.linear_a8w8")
    print(f"dense.linear_a8w8 served by {choice.platform}:{choice.impl}")
    assert choice.platform == "nvidia" and not choice.fallback
    served = gpu.model.ops["dense.linear_a8w8"]
    errors = []

    handed = []

    def checked(x, weight, quantized=None):
        if quantized is not None:
            handed.append(weight.name)
            codes, scales = quantize_fp8_groups(x.float(), 128)
            assert torch.equal(quantized[0], codes) and torch.equal(quantized[1], scales)
        got, want = served(x, weight, quantized), reference_a8w8(x, weight)
        scale = want.float().abs().amax().clamp_min(1e-30)
        errors.append(((got.float() - want.float()).abs().amax() / scale).item())
        return got

    experts = gpu.model.ops["moe.experts"]
    handed_to_experts = []

    def checked_experts(x, *args, quantized=None, **kwargs):
        got = experts(x, *args, quantized=quantized, **kwargs)
        if quantized is not None:
            handed_to_experts.append(x.shape[0])
            codes, scales = quantize_fp8_groups(x.float(), 128)
            assert torch.equal(quantized[0], codes) and torch.equal(quantized[1], scales)
            assert torch.equal(got, experts(x, *args, **kwargs))  # the same codes, the same bits
        return got

    replaced = {"dense.linear_a8w8": checked, "moe.experts": checked_experts}
    with gpu.model.ops.replaced(replaced):
        logits = _logits(gpu, prompt, [4, 9, 2])
    assert torch.isfinite(logits).all()
    # per step: 3 layers x 3 products (2 joined projections, o_proj) + the dense MLP's 3
    assert len(errors) >= 12 * (1 + PROMPT - DECODE_FROM)
    print(f"a8w8 calls: {len(errors)}, worst relative error {max(errors):.2e}")
    assert max(errors) < 2**-6  # a bf16 unit or two of the largest output
    # per step: 2 joined projections and o_proj (its codes from the W_UV product) a layer and
    # the dense MLP's gate and up; never down_proj, whose input no norm or product made
    if norm_quantize:
        assert len(handed) >= (3 * 3 + 2) * (1 + PROMPT - DECODE_FROM)
        assert len([name for name in handed if "o_proj" in name]) >= 3 * (1 + PROMPT - DECODE_FROM)
        assert not [name for name in handed if "down_proj" in name]
        assert len(handed_to_experts) >= 2 * (1 + PROMPT - DECODE_FROM)  # the two MoE layers
    else:
        assert not handed and not handed_to_experts


def test_codes_made_by_a_norm_reach_only_the_a8w8_op(a8w8_model):
    """``quantized`` (the codes and scales a norm wrote for x) is handed to dense.linear_a8w8,
    through a joined projection too, and never to dense.linear or a plain product."""
    from hwrun.engine.linears import LINEAR_A8W8_OP, FusedLinear
    from hwrun.formats.fp8 import quantize_fp8_groups

    config = load_model_config(a8w8_model.path)
    weights = load_weights(a8w8_model.path, config, "cpu", torch.bfloat16)
    seen = []

    def op(x, weight, quantized=None):
        seen.append(quantized)
        return reference_a8w8(x, weight, quantized)

    impl = OpImpl(op=LINEAR_A8W8_OP, name="fake", platform="fake", fn=op)
    table = OpTable({LINEAR_A8W8_OP: Selection(impl, fallback=False)})
    bound = bind_linears(weights, table, torch.bfloat16, LINEAR_A8W8_OP)
    q_a = bound.layers[0].attention.q_a_proj
    x = torch.randn(4, 128).to(torch.bfloat16)
    xq = quantize_fp8_groups(x.float(), 128)
    rows = q_a.weight.shape[0]
    joined = FusedLinear(q_a, (rows // 2, rows - rows // 2))
    assert torch.equal(torch.cat(joined(x, False, xq), -1), q_a(x))
    assert seen == [xq, None]
    plain = Linear(torch.randn(8, 128).to(torch.bfloat16))
    assert torch.equal(plain(x, False, xq), plain(x))
    seen_bf16 = []

    def bf16_op(x, weight):  # dense.linear takes no codes: a call with them would fail here
        seen_bf16.append(weight.name)
        return reference_linear(x, weight)

    q_a_bf16 = bind_linears(weights, _table(bf16_op), torch.bfloat16).layers[0].attention.q_a_proj
    assert torch.equal(q_a_bf16(x, False, xq), q_a_bf16(x)) and len(seen_bf16) == 2


def test_a_shared_expert_of_the_routed_shape_loads_as_their_group_e(fp8_model):
    # One tensor for routed and shared codes (the Triton MoE reads them through one tensor
    # descriptor); the values stay the checkpoint's.
    config = load_model_config(fp8_model.path)
    weights = load_weights(fp8_model.path, config, "cpu", torch.bfloat16)
    stored = load_file(fp8_model.path / "model.safetensors")
    layers = [i for i, moe in enumerate(config.moe_layers) if moe]
    assert layers and config.n_shared_experts == 1
    mlp = weights.layers[layers[0]].mlp
    experts = mlp.w13.shape[0]
    for routed, shared in zip((mlp.w13, mlp.w2), mlp.shared, strict=True):
        assert shared.data.data_ptr() == routed.data.data_ptr() + experts * routed.data.stride(0)
    s = f"model.layers.{layers[0]}.mlp.shared_experts."
    assert torch.equal(mlp.shared[1].data, stored[s + "down_proj.weight"].view(torch.uint8))
    assert torch.equal(mlp.shared[1].scales, stored[s + "down_proj.weight_scale_inv"])
    gate = stored[s + "gate_proj.weight"].view(torch.uint8)
    assert torch.equal(mlp.shared[0].data[: gate.shape[0]], gate)
    e = f"model.layers.{layers[0]}.mlp.experts.{experts - 1}."
    last_down = stored[e + "down_proj.weight"].view(torch.uint8)
    assert torch.equal(mlp.w2.data[experts - 1], last_down)


def test_fp8_expert_activations_run_moe_experts_a8w8(plugins, a8w8_model):  # noqa: F811
    """--expert-activation-dtype fp8: moe.experts runs its a8w8 mode (the routed and shared
    experts' inputs in e4m3, as DeepSeek's inference code), and the logits move by that
    rounding only."""
    flags = dict(model=str(a8w8_model.path), platform="reference", num_kv_tokens=8 * 64)
    fp8 = _runner(plugins, expert_activation_dtype="fp8", **flags)
    assert fp8.model.formats.expert_activation_mode == "a8w8"
    chunk = [ScheduledChunk(0, [5, 9, 11, 3, 7], 0, [1], True)]
    got = fp8.execute(chunk)[0].logits
    plain = _runner(plugins, **flags)
    assert plain.model.formats.expert_activation_mode == "bf16"
    want = plain.execute(chunk)[0].logits
    assert torch.isfinite(got).all() and not torch.equal(got, want)
    assert _relative_row_errors(got, want).max().item() < 0.1  # e4m3 inputs of the MoE layers


def test_codes_made_by_a_norm_reach_moe_experts(plugins, a8w8_model):  # noqa: F811
    """An MoE layer hands its input's codes (HWRUN_NORM_QUANTIZE's post-attention norm) to
    moe.experts as ``quantized``, and calls it without the argument when no norm made them
    (every impl of the op takes it, but none needs to see it)."""
    from hwrun.formats.fp8 import quantize_fp8_groups

    flags = dict(model=str(a8w8_model.path), platform="reference", num_kv_tokens=8 * 64)
    runner = _runner(plugins, expert_activation_dtype="fp8", **flags)
    model = runner.model
    assert not model.norm_quantize  # a CPU engine: the norms write no codes
    moe = next(layer.mlp for layer in model.weights.layers if hasattr(layer.mlp, "w13"))
    x = torch.randn(3, model.config.hidden_size).to(torch.bfloat16)
    xq = quantize_fp8_groups(x.float(), 128)
    experts = model.ops["moe.experts"]
    seen = []

    def recorded(*args, **kwargs):
        seen.append(kwargs.get("quantized", "absent"))
        return experts(*args, **kwargs)

    with model.ops.replaced({"moe.experts": recorded}):
        given = model._mlp(moe, x, xq)
        made = model._mlp(moe, x)
    assert seen[0] is xq and seen[1] == "absent"
    assert torch.equal(given, made)  # the reference computes from x either way


def test_fp8_expert_activations_refuse_experts_not_in_block_fp8(plugins, tmp_path):  # noqa: F811
    build_tiny_model(tmp_path, seed=4, **A8W8_READY)  # bf16 weights
    with pytest.raises(EngineStartupError) as err:
        _runner(plugins, model=str(tmp_path), platform="reference", num_kv_tokens=8 * 64,
                expert_activation_dtype="fp8")  # fmt: skip
    reasons = " | ".join(err.value.reasons)
    assert "is bf16; fp8 expert activations need fp8_block128/fp8_block128_ue8m0" in reasons
    assert "use --expert-activation-dtype bf16" in reasons
