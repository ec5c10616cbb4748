"""What is new in a choice since the last chunk: the engine sends cumulative outputs, SSE sends
deltas. Both endpoints stream through :class:`Deltas`, so their chunks split text the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hwrun.engine.outputs import CompletionOutput, Logprobs, RequestOutput


@dataclass
class Delta:
    """The part of one choice not yet sent."""

    text: str
    token_ids: list[int]
    logprobs: list[Logprobs] | None
    finish_reason: str | None
    stop_reason: int | str | None
    first: bool  # the choice's first chunk


@dataclass
class Deltas:
    """Per choice: how much text and how many tokens were sent."""

    sent_text: dict[int, int] = field(default_factory=dict)
    sent_tokens: dict[int, int] = field(default_factory=dict)

    def next(self, index: int, output: RequestOutput) -> Delta:
        completion: CompletionOutput = output.outputs[0]
        first = index not in self.sent_text
        text_from = self.sent_text.get(index, 0)
        tokens_from = self.sent_tokens.get(index, 0)
        self.sent_text[index] = len(completion.text)
        self.sent_tokens[index] = len(completion.token_ids)
        logprobs = completion.logprobs[tokens_from:] if completion.logprobs is not None else None
        return Delta(
            text=completion.text[text_from:],
            token_ids=completion.token_ids[tokens_from:],
            logprobs=logprobs,
            finish_reason=completion.finish_reason if output.finished else None,
            stop_reason=completion.stop_reason if output.finished else None,
            first=first,
        )

    def completion_tokens(self) -> int:
        return sum(self.sent_tokens.values())


def sse(data: str) -> str:
    """One server-sent event."""
    return f"data: {data}\n\n"


SSE_DONE = sse("[DONE]")
