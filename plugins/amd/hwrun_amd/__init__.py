"""hwrun plugin for AMD Instinct GPUs: the portable Triton tier (from hwrun's core), validated
for ROCm devices and Triton's CPU interpreter, under AITER adapters registered when AMD's AITER
(PyPI amd-aiter) imports; the adapters are not validated on hardware (README.md)."""
