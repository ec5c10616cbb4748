"""Kernel tests: on a machine without a CUDA device (CI) the Triton kernels run on CPU through
Triton's interpreter (TRITON_INTERPRET=1, set here before any kernel module is imported); on a
GPU machine they compile, and test_gpu_kernels.py checks them at the models' shapes.
The interpreter's NumPy >= 2.4 patch lives in core (hwrun.kernels.triton.interpreter), applied
before every launch, so the conformance worker gets it as these tests do.
"""

from __future__ import annotations

import os

import pytest
import torch

from hwrun import knobs

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETER_MODULES = {
    "test_topk.py",
    "test_indexer_logits.py",
    "test_sparse_mla.py",
    "test_lse_combine.py",
    "test_kv_write.py",
    "test_moe.py",
    "test_f16_rows.py",
    "test_linear.py",
    "test_moe_route.py",
    "test_to_slots.py",
    "test_window_fill.py",
    "test_fp32_out_gemm.py",
    "test_norm_quant.py",
    "test_head_quant.py",
    "test_unpack_ptx.py",
}


def pytest_collection_modifyitems(config, items):
    if knobs.triton_interpret():
        return
    skip = pytest.mark.skip(
        reason="CPU-interpreter test (small CPU tensors); on a GPU test_gpu_kernels.py covers it"
    )
    for item in items:
        if item.path.name in INTERPRETER_MODULES and item.path.parent.name == "kernels":
            item.add_marker(skip)
