"""Every HWRUN_* environment variable, read here and nowhere else (and the one variable of
another tool hwrun's own decisions depend on: Triton's TRITON_INTERPRET).

Each knob is a function so tests (and long-lived processes) see the current environment.
"""

import os

from hwrun.errors import UsageError

KNOBS: dict[str, str] = {
    "HWRUN_PLUGINS": "Comma-separated module paths loaded as plugins in addition to the "
    "'hwrun.plugins' entry points (for trees that are not installed).",
    "HWRUN_DISABLE_ENTRY_POINTS": "Set to 1 to load only the reference platform and "
    "HWRUN_PLUGINS, ignoring installed entry points.",
    "HWRUN_PLATFORM": "Default for --platform: a platform name or 'auto' (default).",
    "HWRUN_REFERENCE_FALLBACK": "1 (default; also true, yes, on): an op a platform cannot "
    "serve runs on the reference, reported as a fallback. 0 (also false, no, off): such an op "
    "is an error. Any other value is refused.",
    "HWRUN_COLLECTIVE_TIMEOUT_S": "Seconds a collective of the default torch.distributed "
    "communicator may wait for its peers before every rank raises (default 60).",
    "HWRUN_API_KEY": "Default for `hwrun serve --api-key`: clients must send "
    "'Authorization: Bearer <key>' on /v1 (with --engine vllm it becomes VLLM_API_KEY).",
    "HWRUN_VLLM": "The vllm executable `hwrun serve --engine vllm` runs (default: `vllm` on "
    "PATH), e.g. the one of a separate virtualenv.",
    "HWRUN_PALLAS_INTERPRET": "The TPU plugin's Pallas kernels on the CPU (slow: for CI and "
    "debugging; no statement about TPU hardware): 1 (also true, yes, on) runs them in Pallas's "
    "interpret mode; 'tpu' in its TPU interpret mode, which also emulates the TPU's memories "
    "and DMAs and raises on out-of-bounds reads (slower). 0 or unset (default): they serve TPU "
    "devices only. Any other value is refused.",
    "HWRUN_TORCH_COMPILE": "1 (default; also true, yes, on): on CUDA the engine fuses the "
    "model's plain-torch pieces between op calls (norms, RoPE, concatenations) with "
    "torch.compile, compiled once when the engine starts. 0 (also false, no, off): they run "
    "eagerly. Any other value is refused. Never on CPU or in batch-invariant mode.",
    "HWRUN_DECODE_SIDE_STREAM": "1 (default; also true, yes, on): on CUDA a decode step runs "
    "the MLA query's absorption and RoPE and the latent's norm, RoPE and cache write on a "
    "second stream, alongside the DSA indexer's logits and top-k on the first (CUDA graphs "
    "capture both). 0 (also false, no, off): one stream. Any other value is refused. Not in "
    "batch-invariant mode.",
    "HWRUN_TRITON_PDL": "1 (default; also true, yes, on): on NVIDIA Hopper and later, hwrun's "
    "Triton kernels launch with programmatic dependent launch: each may start while the kernel "
    "before it in the stream finishes, and waits for it before touching the step's data (CUDA "
    "graphs keep the overlap). 0 (also false, no, off): plain launches. Any other value is "
    "refused.",
    "HWRUN_NORM_QUANTIZE": "1 (also true, yes, on; the default): on CUDA, the RMSNorms whose "
    "output feeds an a8w8 op write the e4m3 codes and scales of their output in the same "
    "launch (one Triton kernel instead of the compiled norm and the op's quantizer): with fp8 "
    "linear activations each layer's input norm, q-LoRA's, and the post-attention norm ahead "
    "of a dense MLP "
    "(dense.linear_a8w8), and the per-head W_UV product ahead of o_proj (one Triton launch "
    "in place of cuBLAS's and the quantizer's); with fp8 expert activations the post-attention "
    "norm ahead of an MoE (moe.experts); its GPU test passed on an H100 and it took the bench "
    "model's 32K x 64 step from 7.95 to 7.85 ms there (6.61 to 6.44 ms on an H200). 0 (also "
    "false, no, off): the compiled norm and the op's own quantizer. Any other value is refused. "
    "Not in batch-invariant mode.",
    "HWRUN_GLUON": "1 (also true, yes, on): on NVIDIA Hopper (sm_90), the NVIDIA plugin's "
    "Gluon kernels serve the ops they cover, above the Triton tier and under DeepGEMM (today "
    "indexer.logits_paged with fp8 queries over mxfp4 index keys, and fp8 ones, checked against "
    "the reference on H200s; sparse_mla.decode over fp8_ds_mla rows under FlashMLA, tested on "
    "an H100). 0 or unset (default): off. Any other value is refused.",
    "TRITON_INTERPRET": "Triton's own switch (1/true/on, as Triton reads it): Triton kernels run "
    "in Triton's CPU interpreter. The plugins' portable Triton tier then accepts CPU tensors "
    "(slow: for CI and debugging; vendor-library adapters still need their device). Triton reads "
    "it when a kernel is decorated, so it must be set before hwrun's kernel modules are "
    "imported; worker processes inherit it.",
}


TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off")


class KnobError(UsageError):
    """An environment variable set to a value hwrun does not accept; says which and what to set."""


def _strict_flag(name: str, default: bool) -> bool:
    """A documented boolean knob: unset or empty -> ``default``; anything not listed raises."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in TRUE_VALUES:
        return True
    if raw in FALSE_VALUES:
        return False
    raise KnobError(
        f"{name}={os.environ[name]!r} is not accepted; set it to one of "
        f"{', '.join(TRUE_VALUES)} or {', '.join(FALSE_VALUES)}, or unset it (default "
        f"{'1' if default else '0'})"
    )


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip().lower() not in {"0", "false", "no", "off"}


def extra_plugin_modules() -> list[str]:
    raw = os.environ.get("HWRUN_PLUGINS", "")
    return [part.strip() for part in raw.split(",") if part.strip()]


def entry_points_disabled() -> bool:
    return _flag("HWRUN_DISABLE_ENTRY_POINTS", False)


def default_platform() -> str:
    return os.environ.get("HWRUN_PLATFORM", "auto").strip() or "auto"


def reference_fallback() -> bool:
    """Raises :class:`KnobError` for a value not in KNOBS' list."""
    return _strict_flag("HWRUN_REFERENCE_FALLBACK", True)


def collective_timeout_s() -> float:
    raw = os.environ.get("HWRUN_COLLECTIVE_TIMEOUT_S", "").strip()
    return float(raw) if raw else 60.0


def api_key() -> str | None:
    return os.environ.get("HWRUN_API_KEY") or None


def vllm_executable() -> str | None:
    return os.environ.get("HWRUN_VLLM", "").strip() or None


def torch_compile() -> bool:
    return _strict_flag("HWRUN_TORCH_COMPILE", True)


def decode_side_stream() -> bool:
    return _strict_flag("HWRUN_DECODE_SIDE_STREAM", True)


def triton_pdl() -> bool:
    return _strict_flag("HWRUN_TRITON_PDL", True)


def norm_quantize() -> bool:
    return _strict_flag("HWRUN_NORM_QUANTIZE", True)


def gluon_kernels() -> bool:
    return _strict_flag("HWRUN_GLUON", False)


def triton_interpret() -> bool:
    # Triton's C++ getenv_bool: only "1", "true" and "on" (any case) switch it on.
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "on"}


def pallas_interpret() -> str | None:
    """None (off), "generic" (1 and its synonyms) or "tpu"; raises :class:`KnobError` for a
    value not in KNOBS' list."""
    raw = os.environ.get("HWRUN_PALLAS_INTERPRET", "").strip().lower()
    if raw == "tpu":
        return "tpu"
    if raw in TRUE_VALUES:
        return "generic"
    if raw in ("", *FALSE_VALUES):
        return None
    raise KnobError(
        f"HWRUN_PALLAS_INTERPRET={os.environ['HWRUN_PALLAS_INTERPRET']!r} is not accepted; set "
        f"it to 'tpu', one of {', '.join(TRUE_VALUES)} or {', '.join(FALSE_VALUES)}, or unset it"
    )
