"""One HTTP request fanned out to engine requests (prompts x n), run and closed together.

:class:`RequestGroup` starts every engine request and waits for each one's first output before
the response starts, so a refusal (prompt too long, queue full) is still an HTTP status, not a
broken stream. It then yields ``(choice index, cumulative output)`` as outputs arrive, and on
``aclose`` (the client left, or the handler failed) closes every engine stream, which aborts its
request and frees its KV blocks. :func:`until_disconnected` gives a non-streaming handler the
same: its work is cancelled when the client disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from hwrun.engine.errors import EngineDeadError, PromptError, QueueFullError
from hwrun.engine.outputs import RequestOutput
from hwrun.engine.sampling_params import SamplingParams
from hwrun.serve.errors import APIError
from hwrun.serve.metrics import ServerMetrics

log = logging.getLogger("hwrun.serve")
RETRY_AFTER_S = 1
ENGINE_DEAD = "engine_dead"  # the code of the error a request gets once the engine has died
T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client went away before the response was complete."""


@dataclass
class EngineRequest:
    """One choice: a prompt sampled once, as one engine request."""

    index: int  # the choice index in the response
    prompt_index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str


@dataclass
class _Progress:
    first_token_time: float | None = None
    finished: bool = False


@dataclass
class RequestGroup:
    engine: Any
    metrics: ServerMetrics
    requests: list[EngineRequest]
    arrival: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self._streams: list[AsyncIterator[RequestOutput]] = []
        self._progress = [_Progress() for _ in self.requests]
        self._pumps: list[asyncio.Task] = []
        self._first: list[RequestOutput] = []

    async def start(self) -> None:
        """Submit every request and wait for its first output; refusals become HTTP errors."""
        for request in self.requests:
            stream = self.engine.generate(
                request.prompt_token_ids, request.params, request.request_id
            )
            self._streams.append(aiter(stream))
        results = await asyncio.gather(
            *(anext(stream) for stream in self._streams), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.aclose()
            raise _as_api_error(errors[0])
        self._first = list(results)

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Every output of every request, as it arrives, starting with the first ones."""
        queue: asyncio.Queue = asyncio.Queue()
        remaining = 0
        for i, first in enumerate(self._first):
            self._observe(i, first)
            yield self.requests[i].index, first
            if not first.finished:
                remaining += 1
                self._pumps.append(asyncio.create_task(self._pump(i, queue)))
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise _as_api_error(item)
            else:
                self._observe(i, item)
                yield self.requests[i].index, item

    async def final_outputs(self) -> list[RequestOutput]:
        """The finished output of every request, in choice order."""
        final: dict[int, RequestOutput] = {}
        async for index, output in self.outputs():
            if output.finished:
                final[index] = output
        return [final[r.index] for r in self.requests]

    async def aclose(self) -> None:
        """Stop every pump and close every engine stream: unfinished requests are aborted."""
        for task in self._pumps:
            task.cancel()
        for task in self._pumps:
            with contextlib.suppress(BaseException):
                await task
        for stream in self._streams:
            with contextlib.suppress(Exception):
                await stream.aclose()

    async def _pump(self, i: int, queue: asyncio.Queue) -> None:
        try:
            async for output in self._streams[i]:
                await queue.put((i, output))
        except Exception as err:  # one request failed: the response fails, the server goes on
            log.exception("request %s failed", self.requests[i].request_id)
            await queue.put((i, err))
        finally:
            await queue.put((i, None))

    def _observe(self, i: int, output: RequestOutput) -> None:
        progress = self._progress[i]
        now = time.monotonic()
        tokens = sum(len(c.token_ids) for c in output.outputs)
        if progress.first_token_time is None and tokens:
            progress.first_token_time = now - self.arrival
            self.metrics.observe_first_token(progress.first_token_time)
        if output.finished and not progress.finished:
            progress.finished = True
            reason = (output.outputs[0].finish_reason if output.outputs else None) or "abort"
            self.metrics.observe_finished(
                reason, now - self.arrival, progress.first_token_time, tokens
            )


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it when the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise ClientDisconnected()
    return task.result()


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _as_api_error(err: BaseException) -> BaseException:
    if isinstance(err, APIError):
        return err
    if isinstance(err, PromptError):
        return APIError(400, str(err), param="prompt")
    if isinstance(err, QueueFullError):
        return APIError(
            503,
            f"the server is at capacity ({err}); retry after {RETRY_AFTER_S} s",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if isinstance(err, EngineDeadError):
        return APIError(
            503,
            f"the engine has stopped ({err}); this server cannot serve until it is restarted",
            code=ENGINE_DEAD,
        )
    if isinstance(err, Exception):
        log.error("engine request failed: %r", err)
        return APIError(500, f"the request failed inside the engine: {type(err).__name__}: {err}")
    return err
