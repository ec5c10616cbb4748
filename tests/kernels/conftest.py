"""Kernel tests run the Triton kernels on CPU through Triton's interpreter (TRITON_INTERPRET=1).

Triton 3.6's interpreter holds a scalar as a one-element array and gives tensors an
``__index__`` that calls ``int()`` on it (loop bounds such as ``range(0, n, BLOCK)`` with a
runtime ``n``); NumPy >= 2.4 refuses ``int()`` of an array that is not 0-d. The patch below
keeps the interpreter's own tensor patching and replaces only that ``__index__`` with one that
calls ``.item()``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import triton.runtime.interpreter as _interpreter

_original_patch_lang_tensor = _interpreter._patch_lang_tensor


def _patch_lang_tensor(tensor, scope):
    _original_patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


_interpreter._patch_lang_tensor = _patch_lang_tensor
