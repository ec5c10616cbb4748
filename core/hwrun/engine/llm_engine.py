"""The step loop: requests in, one scheduled batch per step through the model runner, outputs out.

:class:`LLMEngine` is synchronous and single-threaded; :mod:`hwrun.engine.llm` (offline
batches) and :mod:`hwrun.engine.async_engine` (the server) drive it. One :meth:`LLMEngine.step`:

1. the scheduler picks chunks (decodes, prefill chunks, newly admitted requests) under the
   token budget, allocating KV blocks and preempting when the pool is full;
2. the model runner computes them (writes their KV, returns logits where a token is due);
3. the engine records what was computed (full blocks enter the prefix cache), collects prompt
   logprobs, samples the next token of every sequence whose prompt is done, detokenizes it and
   checks the stop conditions: eos (unless ``ignore_eos``), ``stop_token_ids``, stop strings,
   ``max_tokens``, ``max_model_len``. A finished sequence frees its blocks.

With ``async_scheduling``, a step of decodes is read after the next step of the same sequences
has been launched: its tokens are sampled on the device and stay there, the scheduler makes the
following step ahead (``Scheduler.schedule_ahead``, which leaves out the sequences ending by
length) and the runner takes those tokens as its input ids, so the host's work of point 3
overlaps the device's next step. That step is the next :meth:`LLMEngine.step`; its rows of
sequences that ended meanwhile (eos, a stop, an abort) are dropped.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import Any

import torch

from hwrun.engine import sampler
from hwrun.engine.batch import ChunkLogits, ScheduledChunk, last_position_logits
from hwrun.engine.block_manager import BlockManager
from hwrun.engine.config import EngineConfig
from hwrun.engine.errors import PromptError
from hwrun.engine.host_copy import HostCopy, to_device
from hwrun.engine.outputs import CompletionOutput, RequestOutput
from hwrun.engine.sampling_params import SamplingParams
from hwrun.engine.scheduler import Scheduler
from hwrun.engine.sequence import Sequence
from hwrun.engine.stats import EngineStats
from hwrun.engine.tokenizer import (
    IncrementalDetokenizer,
    Tokenizer,
    find_stop_string,
    load_tokenizer,
)

TOKENIZER_FROM_CHECKPOINT: Any = object()  # default of tokenizer=: load the checkpoint's


@dataclass
class _Launched:
    """A step whose device work is queued: its sequences, chunks and the runner's results, and
    its tokens, sampled on the device, when it is a step of decodes (async scheduling only),
    with their copy to the host queued right after them."""

    seqs: list[Sequence]
    chunks: list[ScheduledChunk]
    results: list[ChunkLogits]
    tokens: torch.Tensor | None
    host_tokens: HostCopy | None = None


class LLMEngine:
    """Serves many requests at once on one model runner.

    ``runner``: an already-built model runner (tests); by default the engine builds one from
    ``config`` (checkpoint, op resolution, KV pool). ``tokenizer``: by default the checkpoint's
    (None when it ships none); pass one, or None, to override.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        runner: Any = None,
        tokenizer: Any = TOKENIZER_FROM_CHECKPOINT,
    ):
        if runner is None:
            from hwrun.engine.tp_runner import build_runner

            runner = build_runner(config)
        self.config = config
        self.runner = runner
        self.tokenizer: Tokenizer | None = (
            load_tokenizer(config.model_dir)
            if tokenizer is TOKENIZER_FROM_CHECKPOINT
            else tokenizer
        )
        self.vocab_size: int = runner.vocab_size
        # A sequence must fit the pool on its own, or it would preempt itself forever.
        pool_tokens = runner.num_blocks * runner.block_size
        self.max_model_len: int = min(
            runner.max_model_len, config.max_model_len or runner.max_model_len, pool_tokens
        )
        eos = set(runner.eos_token_ids)  # eos_token_id of the checkpoint's config.json
        if not eos and self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos = {self.tokenizer.eos_token_id}
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self.block_manager = BlockManager(
            runner.num_blocks,
            runner.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
        self.requests: dict[str, Sequence] = {}
        self._detokenizers: dict[int, IncrementalDetokenizer] = {}
        self._seq_ids = itertools.count()
        self._seeds = random.Random(config.seed)  # seeds of requests that bring none
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.async_scheduling = config.async_scheduling
        if self.async_scheduling and not getattr(runner, "device_token_inputs", False):
            raise ValueError(
                f"async scheduling needs a runner that takes token ids on the device; "
                f"{type(runner).__name__} does not (tensor or decode context parallelism): "
                f"drop async_scheduling"
            )
        self._ahead: _Launched | None = None  # a step launched ahead, read by the next step()

    @property
    def op_table(self) -> list:
        return self.runner.op_table

    def make_sequence(
        self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None
    ) -> Sequence:
        """Check and tokenize a request (raises :class:`PromptError`); does not queue it."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise PromptError(f"request id {request_id!r} is already in use")
        text = prompt if isinstance(prompt, str) else None
        if text is not None:
            if self.tokenizer is None:
                raise PromptError(
                    "this model has no tokenizer (no tokenizer.json in its checkpoint): "
                    "send token ids instead of text"
                )
            token_ids = self.tokenizer.encode(text)
        else:
            token_ids = list(prompt)
        if not token_ids:
            raise PromptError("the prompt is empty: send at least one token")
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise PromptError(
                f"prompt token ids {bad[:8]} are outside the vocabulary [0, {self.vocab_size})"
            )
        if len(token_ids) >= self.max_model_len:
            raise PromptError(
                f"the prompt has {len(token_ids)} tokens; this engine's max_model_len is "
                f"{self.max_model_len}, so a prompt may have at most {self.max_model_len - 1}"
            )
        if params.stop and self.tokenizer is None:
            raise PromptError("stop strings need a tokenizer and this model has none")
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
        return Sequence(next(self._seq_ids), request_id, token_ids, params, seed=seed, prompt=text)

    def add_sequence(self, seq: Sequence) -> None:
        """Queue a sequence from :meth:`make_sequence`."""
        if seq.request_id in self.requests:
            raise PromptError(f"request id {seq.request_id!r} is already in use")
        self.requests[seq.request_id] = seq
        if self.tokenizer is not None:
            self._detokenizers[seq.seq_id] = IncrementalDetokenizer(
                self.tokenizer, seq.prompt_token_ids
            )
        self.prompt_tokens_total += seq.num_prompt_tokens
        self.scheduler.add(seq)

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None
    ) -> Sequence:
        seq = self.make_sequence(request_id, prompt, params)
        self.add_sequence(seq)
        return seq

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its blocks; its final output (None if it is not here)."""
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        self._finish(seq, "abort")
        return self.output(seq)

    def close(self) -> None:
        """Release the runner's processes, if it has any (a tensor-parallel group's workers)."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self._ahead is not None

    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; the outputs of the requests that sampled a token.

        With async scheduling, a step of decodes launches the next step of the same
        sequences before its own tokens are read (the module's docstring); that step is this
        method's next call."""
        launched, self._ahead = self._ahead, None
        if launched is None:
            step = self.scheduler.schedule()
            if not step.chunks:
                return []
            launched = self._launch(step.seqs, step.chunks)
        self._record(launched)
        if self.async_scheduling and launched.tokens is not None:
            self._ahead = self._launch_ahead(launched)
        return self._sample(launched)

    def _launch(
        self,
        seqs: list[Sequence],
        chunks: list[ScheduledChunk],
        input_ids: torch.Tensor | None = None,
    ) -> _Launched:
        if input_ids is None:
            results = self.runner.execute(chunks)
        else:
            results = self.runner.execute(chunks, input_ids=input_ids)
        tokens = host_tokens = None
        # A step of decodes: its tokens sampled now, left on the device, so the next step can
        # be launched before they reach the host (each request's generator draws in the same
        # order as when sampled at read time).
        if self.async_scheduling and all(c.is_decode and c.needs_logits for c in chunks):
            rows = last_position_logits(results)  # the step's own tensor: no copy, no views
            tokens = sampler.sample_on_device(
                rows, [seq.params for seq in seqs], [seq.generator(rows.device) for seq in seqs]
            )
            host_tokens = HostCopy(tokens)  # read after the next step is queued
        return _Launched(seqs, chunks, results, tokens, host_tokens)

    def _record(self, launched: _Launched) -> None:
        """What the step computed: positions, full blocks into the prefix cache, prompt
        logprobs. A step launched ahead skips the sequences that ended before it was read."""
        step = zip(launched.seqs, launched.chunks, launched.results, strict=True)
        for seq, chunk, result in step:
            if seq.is_finished:
                continue
            seq.num_computed_tokens = chunk.end
            self.block_manager.cache_full_blocks(seq)
            if chunk.all_logits and seq.needs_prompt_logprobs:
                self._collect_prompt_logprobs(seq, chunk.start, result.logits)

    def _launch_ahead(self, launched: _Launched) -> _Launched | None:
        """The next step of ``launched``'s sequences, launched now with its tokens taken from
        the device (None when the scheduler would schedule otherwise)."""
        live = [(row, seq) for row, seq in enumerate(launched.seqs) if not seq.is_finished]
        ending = {
            seq.seq_id
            for _, seq in live
            if seq.num_output_tokens + 1 >= seq.params.max_tokens
            or seq.num_tokens + 1 >= self.max_model_len
        }
        step = self.scheduler.schedule_ahead([seq for _, seq in live], ending)
        if step is None:
            return None
        rows = [row for row, seq in live if seq.seq_id not in ending]
        tokens = launched.tokens
        if rows != list(range(len(launched.seqs))):
            tokens = tokens[to_device(rows, torch.int64, tokens.device)]
        return self._launch(step.seqs, step.chunks, input_ids=tokens)

    def _sample(self, launched: _Launched) -> list[RequestOutput]:
        """Sample (or read) each due row's token, append it and check the stop conditions."""
        due = [
            (row, seq, result)
            for row, (seq, chunk, result) in enumerate(
                zip(launched.seqs, launched.chunks, launched.results, strict=True)
            )
            if chunk.needs_logits and not seq.is_finished
        ]
        if not due:
            return []
        params = [seq.params for _, seq, _ in due]
        if launched.tokens is None:  # sampled now
            rows = last_position_logits([result for _, _, result in due])
            generators = [seq.generator(rows.device) for _, seq, _ in due]
            tokens, logprobs = sampler.sample(rows, params, generators)
        else:  # sampled at launch (async scheduling)
            launched_tokens = launched.host_tokens.tolist()
            tokens = [launched_tokens[row] for row, _, _ in due]
            logprobs = [None] * len(due)
            if any(p.logprobs is not None for p in params):
                # Each row where its step's tensor holds it, as launched steps always read them
                rows = [result.logits[-1] for _, _, result in due]
                logprobs = sampler.token_logprobs(rows, tokens, params)
        outputs = []
        for (_, seq, _), token, token_logprobs in zip(due, tokens, logprobs, strict=True):
            self._append_token(seq, token, token_logprobs)
            outputs.append(self.output(seq))
        return outputs

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_blocks_total=self.block_manager.num_blocks,
            kv_blocks_used=self.block_manager.num_used_blocks,
            prefix_cache_queries=self.block_manager.prefix_cache_queries,
            prefix_cache_hits=self.block_manager.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
        )

    def output(self, seq: Sequence) -> RequestOutput:
        """``seq``'s cumulative output now. While stop strings may still match, the last
        characters that could begin one are held back, so streamed text never shrinks."""
        text = seq.text
        if seq.params.stop and not seq.is_finished:
            text = text[: max(0, len(text) - max(len(s) for s in seq.params.stop) + 1)]
        completion = CompletionOutput(
            index=0,
            token_ids=seq.output_token_ids,
            text=text,
            logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )
        prompt_logprobs = seq.prompt_logprobs
        return RequestOutput(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            prompt_logprobs=list(prompt_logprobs) if prompt_logprobs is not None else None,
            outputs=[completion],
            finished=seq.is_finished,
            metrics=seq.metrics.snapshot(),
        )

    def _collect_prompt_logprobs(
        self, seq: Sequence, start: int, logits: torch.Tensor | None
    ) -> None:
        """Row ``i`` of ``logits`` is position ``start + i``: it scores prompt token
        ``start + i + 1``. Positions collected before a preemption are not collected again."""
        assert logits is not None, "the runner returned no logits for an all_logits chunk"
        collected = seq.prompt_logprobs
        first = len(collected) - 1 - start  # row of the first position still missing
        last = min(start + logits.shape[0], seq.num_prompt_tokens - 1) - start
        if first < 0 or first >= last:
            return
        targets = seq.token_ids[start + first + 1 : start + last + 1]
        collected.extend(
            sampler.prompt_logprobs(logits[first:last], targets, seq.params.prompt_logprobs)
        )

    def _append_token(self, seq: Sequence, token: int, logprobs: dict | None) -> None:
        params = seq.params
        seq.append_token(token)
        self.generation_tokens_total += 1
        if logprobs is not None:
            seq.logprobs.append(logprobs)
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = time.monotonic()
        if token in self.eos_token_ids and not params.ignore_eos:
            self._finish(seq, "stop")
            return
        if token in params.stop_token_ids:
            self._finish(seq, "stop", token)
            return
        detokenizer = self._detokenizers.get(seq.seq_id)
        if detokenizer is not None:
            new_text = detokenizer.add(token)
            seq.text += new_text
            found = find_stop_string(seq.text, len(new_text), params.stop) if new_text else None
            if found is not None:
                stop, start = found
                end = start + len(stop) if params.include_stop_str_in_output else start
                seq.text = seq.text[:end]
                self._finish(seq, "stop", stop)
                return
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        self.scheduler.remove(seq)
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        seq.metrics.finished_time = time.monotonic()
        del self.requests[seq.request_id]
        self._detokenizers.pop(seq.seq_id, None)
