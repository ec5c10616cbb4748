"""Offline batches: ``LLM(...).generate(prompts, sampling_params)``, shaped like vLLM's ``LLM``.

from hwrun import LLM, SamplingParams

llm = LLM()  # the embedded default model on the best platform here
outputs = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=64))
print(outputs[0].outputs[0].text)
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence as SequenceOf
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hwrun.engine.config import EngineConfig
from hwrun.engine.llm_engine import TOKENIZER_FROM_CHECKPOINT, LLMEngine
from hwrun.engine.outputs import RequestOutput
from hwrun.engine.sampling_params import SamplingParams
from hwrun.engine.stats import EngineStats
from hwrun.engine.tokenizer import Tokenizer

_CONFIG_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}


class LLM:
    """A model loaded on one platform, generating for batches of prompts.

    ``model``: a checkpoint directory (None: hwrun's embedded default model). The other
    arguments, and ``engine_flags``, are :class:`~hwrun.engine.config.EngineConfig` fields
    (``max_num_seqs``, ``max_num_batched_tokens``, ``num_kv_tokens``, ``enable_prefix_caching``,
    ``batch_invariant``, ...). ``runner`` / ``tokenizer``: an already-built model runner and
    tokenizer, for tests.
    """

    def __init__(
        self,
        model: str | None = None,
        platform: str = "auto",
        kv_cache_dtype: str = "bf16",
        index_dtype: str = "bf16",
        max_model_len: int | None = None,
        *,
        runner: Any = None,
        tokenizer: Any = TOKENIZER_FROM_CHECKPOINT,
        **engine_flags: Any,
    ):
        unknown = sorted(set(engine_flags) - _CONFIG_FIELDS)
        if unknown:
            raise TypeError(
                f"LLM() got unknown engine options {unknown}; "
                f"the options are {sorted(_CONFIG_FIELDS)}"
            )
        config = EngineConfig(
            model=model,
            platform=platform,
            kv_cache_dtype=kv_cache_dtype,
            index_dtype=index_dtype,
            max_model_len=max_model_len,
            **engine_flags,
        )
        self._start(config, runner, tokenizer)

    @classmethod
    def from_config(
        cls, config: EngineConfig, *, runner: Any = None, tokenizer: Any = TOKENIZER_FROM_CHECKPOINT
    ) -> LLM:
        """An LLM for an EngineConfig already made (the CLI builds one from its flags)."""
        llm = cls.__new__(cls)
        llm._start(config, runner, tokenizer)
        return llm

    def _start(self, config: EngineConfig, runner: Any, tokenizer: Any) -> None:
        self.engine = LLMEngine(config, runner=runner, tokenizer=tokenizer)
        self._request_ids = itertools.count()

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    @property
    def op_table(self) -> list:
        return self.engine.op_table

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def generate(
        self,
        prompts: str | SequenceOf[str] | None = None,
        sampling_params: SamplingParams | SequenceOf[SamplingParams] | None = None,
        *,
        prompt_token_ids: list[int] | list[list[int]] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Complete every prompt (text, or token ids through ``prompt_token_ids``); the final
        outputs in input order. ``sampling_params``: one for all, or one per prompt.
        ``use_tqdm``: show a progress bar (rich, named as vLLM names the option)."""
        requests = _prompts(prompts, prompt_token_ids)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(requests)
        if len(sampling_params) != len(requests):
            raise ValueError(
                f"{len(sampling_params)} sampling params for {len(requests)} prompts: "
                "give one for all, or one per prompt"
            )
        seqs = [
            self.engine.make_sequence(f"llm-{next(self._request_ids)}", prompt, params)
            for prompt, params in zip(requests, sampling_params, strict=True)
        ]  # every prompt is checked before any starts
        for seq in seqs:
            self.engine.add_sequence(seq)
        finished: dict[str, RequestOutput] = {}
        try:
            with _progress(use_tqdm) as progress:
                task = progress.add_task("generating", total=len(seqs), rate="")
                start, generated = time.monotonic(), self.engine.generation_tokens_total
                while len(finished) < len(seqs):
                    for out in self.engine.step():
                        if out.finished:
                            finished[out.request_id] = out
                    tokens = self.engine.generation_tokens_total - generated
                    rate = tokens / max(time.monotonic() - start, 1e-9)
                    progress.update(task, completed=len(finished), rate=f"{rate:.1f} tok/s")
        finally:
            for seq in seqs:
                if seq.request_id not in finished:
                    self.engine.abort_request(seq.request_id)
        return [finished[seq.request_id] for seq in seqs]


def _prompts(
    prompts: str | SequenceOf[str] | None, prompt_token_ids: list[int] | list[list[int]] | None
) -> list[str | list[int]]:
    if (prompts is None) == (prompt_token_ids is None):
        raise ValueError("give either prompts (text) or prompt_token_ids, not both or neither")
    if prompts is not None:
        return [prompts] if isinstance(prompts, str) else list(prompts)
    if prompt_token_ids and all(isinstance(t, int) for t in prompt_token_ids):
        return [list(prompt_token_ids)]
    return [list(ids) for ids in prompt_token_ids]


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),  # stdout stays for what the caller prints
        disable=not enabled,
    )
