"""Kernel tests: on a machine without a CUDA device (CI) the Triton kernels run on CPU through
Triton's interpreter (TRITON_INTERPRET=1, set here before any kernel module is imported); on a
GPU machine they compile, and test_gpu_kernels.py checks them at the models' shapes.

Triton 3.6's interpreter holds a scalar as a one-element array and gives tensors an
``__index__`` that calls ``int()`` on it (loop bounds such as ``range(0, n, BLOCK)`` with a
runtime ``n``); NumPy >= 2.4 refuses ``int()`` of an array that is not 0-d. The patch below
keeps the interpreter's own tensor patching and replaces only that ``__index__`` with one that
calls ``.item()``.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton.runtime.interpreter as _interpreter

INTERPRETER_MODULES = {
    "test_topk.py",
    "test_indexer_logits.py",
    "test_sparse_mla.py",
    "test_lse_combine.py",
    "test_kv_write.py",
}

_original_patch_lang_tensor = _interpreter._patch_lang_tensor


def _patch_lang_tensor(tensor, scope):
    _original_patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


_interpreter._patch_lang_tensor = _patch_lang_tensor


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    skip = pytest.mark.skip(
        reason="CPU-interpreter test (small CPU tensors); on a GPU test_gpu_kernels.py covers it"
    )
    for item in items:
        if item.path.name in INTERPRETER_MODULES and item.path.parent.name == "kernels":
            item.add_marker(skip)
