"""Prompts as the engine takes them (token ids), and tokens as the client reads them (text).

A completion prompt is text, a list of texts, token ids or a list of token-id lists; a chat
prompt is messages through the model's chat template. Each is checked before the engine sees it:
token ids inside the vocabulary, and room left under ``max_model_len`` for at least one token.
A model without a tokenizer takes token ids only, and shows tokens as ``token_id:N`` (vLLM's
``return_tokens_as_token_ids`` form).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hwrun.serve.errors import bad_request


@dataclass(frozen=True)
class Prompt:
    """One prompt: its token ids, and its text when the client sent text."""

    token_ids: list[int]
    text: str | None = None


class TokenText:
    """Renders token ids for a response: decoded text, or ``token_id:N`` when the client asked
    for ids or the model has no tokenizer."""

    def __init__(self, tokenizer: Any | None, as_token_ids: bool = False):
        self.tokenizer = tokenizer
        self.as_token_ids = as_token_ids or tokenizer is None

    def token(self, token_id: int) -> str:
        if self.as_token_ids:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id])

    def text(self, token_ids: list[int]) -> str:
        """Text of a run of tokens (a prompt sent as ids, for echo); "" without a tokenizer."""
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids)


def completion_prompts(
    prompt: str | list, tokenizer: Any | None, vocab_size: int, max_model_len: int
) -> list[Prompt]:
    """The prompts of a completion request, each checked; a 400 says which one and why."""
    if isinstance(prompt, str):
        items: list = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        items = [list(prompt)]
    else:
        items = list(prompt)
    if not items:
        raise bad_request("prompt is an empty list; send text or token ids", param="prompt")
    prompts = []
    for i, item in enumerate(items):
        where = "prompt" if len(items) == 1 else f"prompt[{i}]"
        if isinstance(item, str):
            if tokenizer is None:
                raise bad_request(
                    f"{where} is text but this model has no tokenizer; send token ids "
                    '(for example "prompt": [1, 2, 3])',
                    param="prompt",
                )
            prompts.append(Prompt(list(tokenizer.encode(item)), item))
        else:
            prompts.append(Prompt(list(item)))
        check_prompt(prompts[-1].token_ids, where, vocab_size, max_model_len)
    return prompts


def chat_prompt(
    messages: list[dict], tokenizer: Any | None, vocab_size: int, max_model_len: int
) -> Prompt:
    if tokenizer is None or not getattr(tokenizer, "has_chat_template", False):
        raise bad_request(
            "this model has no chat template, so /v1/chat/completions cannot render messages; "
            "use /v1/completions with a text or token-id prompt",
            param="messages",
        )
    ids = list(tokenizer.apply_chat_template(messages))
    check_prompt(ids, "messages", vocab_size, max_model_len)
    return Prompt(ids)


def check_prompt(token_ids: list[int], where: str, vocab_size: int, max_model_len: int) -> None:
    if not token_ids:
        raise bad_request(f"{where} is empty; send at least one token", param="prompt")
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(
            f"{where} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}",
            param="prompt",
        )
    if len(token_ids) >= max_model_len:
        raise bad_request(
            f"{where} is {len(token_ids)} tokens; this model's max_model_len is {max_model_len}, "
            f"which must also leave room for one generated token: shorten it to at most "
            f"{max_model_len - 1} tokens",
            param="messages" if where == "messages" else "prompt",
        )


def max_tokens_for(
    requested: int | None, default: int | None, prompt_len: int, max_len: int
) -> int:
    """``max_tokens`` for one prompt: as requested (refused past ``max_model_len``), else the
    endpoint's default capped at the room left."""
    room = max_len - prompt_len
    if requested is None:
        return room if default is None else min(default, room)
    if isinstance(requested, int) and requested > room:
        raise bad_request(
            f"prompt ({prompt_len} tokens) + max_tokens ({requested}) exceeds this model's "
            f"max_model_len {max_len}: lower max_tokens to at most {room} or shorten the prompt",
            param="max_tokens",
        )
    return requested
