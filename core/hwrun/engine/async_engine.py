"""The engine for a server: many concurrent streaming requests over one step loop.

A background thread owns the :class:`~hwrun.engine.llm_engine.LLMEngine` and runs its step loop
while there is work. The event loop's side never touches the engine's state: ``generate``
checks and tokenizes the request (raising :class:`PromptError` / :class:`QueueFullError` to its
caller), then posts it to the thread's inbox; the thread posts each output back to the request's
asyncio queue. A consumer that stops iterating (``aclose``, a cancelled task, a dropped client)
posts an abort, which frees the request's KV blocks on the next turn of the loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from hwrun.engine.config import EngineConfig
from hwrun.engine.errors import EngineDeadError, PromptError, QueueFullError
from hwrun.engine.llm_engine import TOKENIZER_FROM_CHECKPOINT, LLMEngine
from hwrun.engine.outputs import RequestOutput
from hwrun.engine.sampling_params import SamplingParams
from hwrun.engine.sequence import Sequence
from hwrun.engine.stats import EngineStats
from hwrun.engine.tokenizer import Tokenizer

__all__ = ["AsyncEngine", "EngineDeadError", "PromptError", "QueueFullError"]


class AsyncEngine:
    """Streams requests through one engine. ``max_queued`` bounds the requests waiting to start
    (None: unbounded); ``runner`` / ``tokenizer`` as for :class:`LLMEngine` (tests)."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        max_queued: int | None = None,
        runner: Any = None,
        tokenizer: Any = TOKENIZER_FROM_CHECKPOINT,
    ):
        self._engine = LLMEngine(config, runner=runner, tokenizer=tokenizer)
        self.tokenizer: Tokenizer | None = self._engine.tokenizer
        self.model_name = config.model_dir.name if config.model else "hwrun-default"
        self.max_model_len = self._engine.max_model_len
        self.vocab_size = self._engine.vocab_size
        self.op_table = self._engine.op_table
        self.max_queued = max_queued
        self._lock = threading.Lock()  # guards the inbox and the streams
        self._inbox: list[tuple[str, Sequence | str]] = []  # ("add", seq) / ("abort", id)
        self._wake = threading.Event()
        self._streams: dict[str, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._accepting = True
        self._stop = False
        self._failure: EngineDeadError | None = None

    async def start(self) -> None:
        """Start the step loop on a background thread, delivering to the running event loop."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="hwrun-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, drain_timeout: float = 30.0) -> None:
        """Stop accepting requests, let those already accepted finish for up to
        ``drain_timeout`` seconds, abort the rest (their streams end with finish_reason
        "abort") and stop the step loop."""
        self._accepting = False
        deadline = time.monotonic() + drain_timeout
        while self._streams and self._failure is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        with self._lock:
            self._inbox.extend(("abort", request_id) for request_id in self._streams)
            self._stop = True
            self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        self._engine.close()

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs of one request, one per step that changed it; the last has
        ``finished=True``. Raises PromptError / QueueFullError on the first ``__anext__``."""
        if self._failure is not None:
            raise self._failure
        if not self._accepting:
            raise QueueFullError("the engine is shutting down and takes no new requests")
        seq = self._engine.make_sequence(request_id, prompt, params)
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if request_id in self._streams:
                raise PromptError(f"request id {request_id!r} is already in use")
            if self.max_queued is not None and self._num_waiting() >= self.max_queued:
                raise QueueFullError(
                    f"{self.max_queued} requests are already waiting to start: retry later"
                )
            self._streams[request_id] = queue
            self._inbox.append(("add", seq))
            self._wake.set()
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:  # the consumer stopped early: free the request's blocks
                self._post_abort(request_id)

    async def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with finish_reason "abort"."""
        with self._lock:
            if request_id in self._streams:
                self._inbox.append(("abort", request_id))
                self._wake.set()

    def stats(self) -> EngineStats:
        stats = self._engine.stats()
        with self._lock:
            return dataclasses.replace(stats, num_waiting=self._num_waiting())

    def _num_waiting(self) -> int:
        """Requests accepted and not started: in the engine's queue or still in the inbox."""
        pending = sum(1 for kind, _ in self._inbox if kind == "add")
        return len(self._engine.scheduler.waiting) + pending

    def _post_abort(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)
            self._inbox.append(("abort", request_id))
            self._wake.set()

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        self._deliver_all([(request_id, item)])

    def _deliver_all(self, items: list[tuple[str, RequestOutput | BaseException]]) -> None:
        """Post ``items`` to their streams in one call into the event loop: a step's 64
        outputs as 64 calls woke the loop 64 times and held the GIL the step thread needs."""
        deliveries = []
        with self._lock:
            for request_id, item in items:
                queue = self._streams.get(request_id)
                if queue is None:
                    continue
                if isinstance(item, BaseException) or item.finished:
                    del self._streams[request_id]
                deliveries.append((queue, item))
        if deliveries:
            self._loop.call_soon_threadsafe(_put_each, deliveries)

    def _run(self) -> None:
        """The step loop (engine thread): inbox, then one step, until shutdown."""
        engine = self._engine
        try:
            while True:
                with self._lock:
                    stopping = self._stop
                    commands, self._inbox = self._inbox, []
                    if not commands and not engine.has_unfinished_requests() and not stopping:
                        self._wake.clear()
                for kind, payload in commands:
                    if kind == "add":
                        self._add(payload)
                    else:
                        out = engine.abort_request(payload)
                        if out is not None:
                            self._deliver(payload, out)
                if stopping:
                    return
                if engine.has_unfinished_requests():
                    self._deliver_all([(out.request_id, out) for out in engine.step()])
                elif not commands:
                    self._wake.wait()
        except Exception as err:
            self._failure = EngineDeadError(f"the engine's step loop failed: {err!r}")
            self._failure.__cause__ = err
            with self._lock:
                request_ids = list(self._streams)
            for request_id in request_ids:
                self._deliver(request_id, self._failure)

    def _add(self, seq: Sequence) -> None:
        with self._lock:
            wanted = seq.request_id in self._streams
        if not wanted:  # its consumer left before it started
            return
        try:
            self._engine.add_sequence(seq)
        except PromptError as err:
            self._deliver(seq.request_id, err)


def _put_each(deliveries: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue, item in deliveries:
        queue.put_nowait(item)
