"""Portable Triton kernels of the catalogue ops (NVIDIA and AMD; TRITON_INTERPRET=1 on CPU)."""
