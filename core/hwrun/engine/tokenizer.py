"""The checkpoint's tokenizer, streaming detokenization and stop strings.

A checkpoint directory with a ``tokenizer.json`` (and usually a ``tokenizer_config.json``, which
carries the chat template and special tokens) gets a :class:`Tokenizer`, loaded with
transformers' ``AutoTokenizer``. A checkpoint without one has no tokenizer: the engine then takes
token-id prompts only and refuses text.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from hwrun.errors import HwrunError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class Tokenizer:
    """Text <-> token ids for one checkpoint. Safe to call from several threads (the server's
    event loop encodes while the engine thread decodes: Hugging Face fast tokenizers refuse
    concurrent use)."""

    def __init__(self, hf_tokenizer: Any):
        self._hf = hf_tokenizer
        self._lock = threading.Lock()

    @property
    def eos_token_id(self) -> int | None:
        return self._hf.eos_token_id

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._hf, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, with the special tokens the tokenizer adds (e.g. BOS)."""
        with self._lock:
            return list(self._hf.encode(text))

    def decode(self, token_ids: list[int]) -> str:
        """Text of ``token_ids``, special tokens left out."""
        with self._lock:
            return self._hf.decode(token_ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """Token ids of a chat, ending with the prompt for the assistant's turn."""
        if not self.has_chat_template:
            raise HwrunError(
                "this model's tokenizer has no chat template (no 'chat_template' in its "
                "tokenizer_config.json): send a plain completion prompt instead"
            )
        with self._lock:
            ids = self._hf.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        if hasattr(ids, "keys"):  # a BatchEncoding on transformers versions that ignore the flag
            ids = ids["input_ids"]
        return list(ids)


def load_tokenizer(model_dir: Path) -> Tokenizer | None:
    """The tokenizer in ``model_dir``, or None when the checkpoint ships none."""
    model_dir = Path(model_dir)
    if not (model_dir / "tokenizer.json").is_file():
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise HwrunError(
            f"{model_dir} has a tokenizer, and loading it needs transformers: "
            "pip install 'transformers>=5'"
        ) from err
    return Tokenizer(AutoTokenizer.from_pretrained(str(model_dir)))


class IncrementalDetokenizer:
    """Output text of a sequence as its tokens arrive (vLLM's offsets scheme).

    A token's text can depend on its neighbours (a leading space, a multi-byte character split
    over tokens), so each step decodes a short window: the text of ``ids[prefix:]`` minus that
    of ``ids[prefix:read]`` is new, unless it ends in an incomplete character (U+FFFD), which
    waits for the next token. A few prompt tokens seed the window.
    """

    CONTEXT_TOKENS = 5

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.ids = list(prompt_token_ids[-self.CONTEXT_TOKENS :])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, token_id: int) -> str:
        """The text ``token_id`` completes ("" while a character is incomplete)."""
        self.ids.append(token_id)
        prefix_text = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if full_text.endswith("\ufffd") or len(full_text) <= len(prefix_text):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return full_text[len(prefix_text) :]


def find_stop_string(text: str, new_chars: int, stops: tuple[str, ...]) -> tuple[str, int] | None:
    """The stop string that ends earliest in ``text`` among those overlapping its last
    ``new_chars`` characters, and where it starts; None when none occurs."""
    found: tuple[str, int] | None = None
    for stop in stops:
        start = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))
        if start >= 0 and (found is None or start + len(stop) < found[1] + len(found[0])):
            found = (stop, start)
    return found
