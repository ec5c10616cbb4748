"""hwrun plugin for AMD Instinct GPUs: the portable Triton tier (from hwrun's core), validated
for ROCm devices and Triton's CPU interpreter; no vendor-library adapters yet."""
