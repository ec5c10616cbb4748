"""The small DeepseekV32 checkpoint shipped inside hwrun (model card: README.md beside this file).

`hwrun generate` and `hwrun serve` load it when no `--model` is given. The directory holds a
Hugging Face checkpoint (config.json, model.safetensors, tokenizer files); `train/` holds the
scripts that built it from the Python standard library's own source.
"""

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent
"""Where the shipped checkpoint lives: load it with `from_pretrained(DEFAULT_MODEL_DIR)`."""

__all__ = ["DEFAULT_MODEL_DIR"]
