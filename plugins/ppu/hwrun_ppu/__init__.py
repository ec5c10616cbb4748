"""hwrun plugin for Alibaba T-HEAD Zhenwu PPUs: torch-native ops, W4A16 MoE."""
