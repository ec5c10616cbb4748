"""Why the engine refused a request: each error says what was asked and what to change.

The server maps :class:`PromptError` to HTTP 400 and :class:`QueueFullError` to 503.
"""

from hwrun.errors import HwrunError


class PromptError(ValueError):
    """The request cannot run as given: an empty prompt, text for a model without a tokenizer,
    a token id outside the vocabulary, a prompt too long for ``max_model_len``, stop strings
    without a tokenizer, or a request id already in use."""


class QueueFullError(RuntimeError):
    """The engine's waiting queue is full (or the engine is shutting down): retry later."""


class EngineDeadError(HwrunError):
    """The engine's step loop failed; every request in flight ends with this error."""
