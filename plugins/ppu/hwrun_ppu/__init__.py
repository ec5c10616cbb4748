"""hwrun plugin for Alibaba T-HEAD Zhenwu PPUs: the portable Triton tier (with the W4A16 MoE)
under the PPU's limits, and vllm-sail's validated layouts."""
