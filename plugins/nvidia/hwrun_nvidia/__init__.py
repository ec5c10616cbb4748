"""hwrun plugin for NVIDIA GPUs: Triton tier tuned for Hopper/Blackwell, DeepGEMM / FlashMLA /
FlashInfer adapters."""
