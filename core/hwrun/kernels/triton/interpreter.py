"""Triton's CPU interpreter (TRITON_INTERPRET=1), made to compute as the GPUs do.

Two defects of Triton 3.6's interpreter are patched, both in the interpreter only, and one of its
costs is cut:

- It holds a scalar as a one-element array and gives tensors an ``__index__`` that calls
  ``int()`` on it (loop bounds such as ``range(0, n, BLOCK)`` with a runtime ``n``); NumPy >= 2.4
  refuses ``int()`` of an array that is not 0-d. The patch keeps the interpreter's own tensor
  patching and replaces only that ``__index__`` with one that reads the single element.
- It rounds fp32 -> bf16 by truncation (``x.to(tl.bfloat16)`` and every store of fp32 values to
  a bf16 tensor), where the GPUs round to nearest even, as torch does: a whole bf16 ulp of error
  instead of half, enough to move a bf16 output past the conformance quality target. The patch
  rounds to nearest even (NaN stays NaN); explicit round-toward-zero keeps truncating. Its
  bf16 -> fp32 also loses subnormals, where the exact widening is a 16-bit shift.
- Every call of a ``@triton.jit`` helper inside a kernel patches ``triton.language`` again
  (``_patch_lang``: ``inspect.getmembers`` over four modules), which the launch has already
  done: 4.0 of 13.0 s profiled in one of ``test_topk``'s edge-row cases (3.96 s, 2.88 s
  with the cut). While a launch holds its patches, a helper that sees no language module the
  launch has not patched gets an empty scope; the launch's own patches and their restore are
  untouched, and Triton 3.6 and 3.9 have the same ``_patch_lang``.

Every kernel host function calls :func:`prepare_launch` before it launches, so any process that
runs the kernels (a test, a conformance worker, ``hwrun serve``) gets the patches.
"""

from __future__ import annotations

import numpy as np

from hwrun import knobs

_patched = False


def bf16_round_to_nearest_even(values: np.ndarray) -> np.ndarray:  # float32 -> uint16 bits
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    quiet_nan = ((bits >> 16) | 0x0040).astype(np.uint16)
    return np.where(np.isnan(values), quiet_nan, rounded)


def bf16_widen(bits: np.ndarray) -> np.ndarray:  # uint16 bf16 bits -> float32, exactly
    return (np.ascontiguousarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def prepare_launch() -> None:
    """Patch the interpreter once when it is on; nothing to do for compiled kernels."""
    global _patched
    if _patched or not knobs.triton_interpret():
        return
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    original_patch = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope) -> None:
        original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    original_convert = interpreter._convert_float
    round_toward_zero = interpreter._ir.ROUNDING_MODE.RTZ

    def convert_float(data, input_dtype, output_dtype, rounding_mode):
        if (
            input_dtype == tl.float32
            and output_dtype == tl.bfloat16
            and rounding_mode != round_toward_zero
        ):
            return bf16_round_to_nearest_even(data)
        if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
            return bf16_widen(data)
        return original_convert(data, input_dtype, output_dtype, rounding_mode)

    interpreter._patch_lang_tensor = patch_lang_tensor
    interpreter._convert_float = convert_float
    interpreter._patch_lang = _patching_once_a_launch(interpreter)
    _patched = True


def _patching_once_a_launch(interpreter):
    """``_patch_lang`` that patches each language module once a launch (see the module's doc)."""
    original_patch_lang = interpreter._patch_lang
    patched: set[int] = set()  # ids of the language modules the launch in flight has patched
    languages = interpreter.tl, interpreter.tl.core

    def patch_lang(fn):
        seen = {id(v) for v in fn.__globals__.values() if any(v is lang for lang in languages)}
        if patched and seen <= patched:
            return interpreter._LangPatchScope()  # nothing to patch, nothing to restore
        scope = original_patch_lang(fn)
        if not patched:  # the launch's own scope: its restore ends the launch
            restore = scope.restore

            def restore_and_forget() -> None:
                patched.clear()
                restore()

            scope.restore = restore_and_forget
        patched.update(seen)
        return scope

    return patch_lang
