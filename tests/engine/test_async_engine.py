"""AsyncEngine: streaming, cancellation frees blocks, bounded queue, shutdown, failures."""

import asyncio
import threading
import time

import pytest

from hwrun.engine.async_engine import AsyncEngine, PromptError, QueueFullError
from hwrun.engine.config import EngineConfig
from hwrun.engine.errors import EngineDeadError
from hwrun.engine.sampling_params import SamplingParams
from hwrun.engine.stats import EngineStats

from .fake_runner import FakeRunner
from .test_llm_engine import reference_greedy

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def make(runner=None, **kwargs) -> AsyncEngine:
    max_queued = kwargs.pop("max_queued", None)
    return AsyncEngine(
        EngineConfig(**kwargs), max_queued=max_queued, runner=runner or FakeRunner(), tokenizer=None
    )


async def collect(engine: AsyncEngine, prompt, request_id: str, params=GREEDY):
    return [out async for out in engine.generate(prompt, params, request_id)]


async def until(condition, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async_scheduling"])
def test_streams_cumulative_outputs_of_concurrent_requests(async_scheduling):
    async def main():
        runner = FakeRunner()
        engine = make(runner, async_scheduling=async_scheduling)
        await engine.start()
        prompts = [[1, 2, 3], list(range(10, 30)), [7]]
        streams = await asyncio.gather(
            *(collect(engine, p, f"r{i}") for i, p in enumerate(prompts))
        )
        for prompt, stream in zip(prompts, streams, strict=True):
            assert [len(out.outputs[0].token_ids) for out in stream] == list(range(1, 9))
            assert [out.finished for out in stream] == [False] * 7 + [True]
            assert stream[-1].outputs[0].token_ids == reference_greedy(prompt, 8)
        stats = engine.stats()
        assert isinstance(stats, EngineStats) and stats.generation_tokens_total == 24
        assert (runner.ahead_steps > 0) == async_scheduling
        await engine.shutdown()

    asyncio.run(main())


def test_a_consumer_that_stops_aborts_the_request_and_frees_its_blocks():
    async def main():
        engine = make()
        await engine.start()
        params = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
        stream = engine.generate(list(range(40)), params, "long")
        first = await stream.__anext__()
        assert not first.finished and engine.stats().kv_blocks_used > 0
        await stream.aclose()
        await until(lambda: engine.stats().kv_blocks_used == 0)
        assert engine.stats().num_running == 0

        task = asyncio.create_task(collect(engine, list(range(40)), "cancelled", params))
        await until(lambda: engine.stats().kv_blocks_used > 0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: engine.stats().kv_blocks_used == 0)
        await engine.shutdown()

    asyncio.run(main())


def test_abort_ends_the_stream_with_abort():
    async def main():
        engine = make()
        await engine.start()
        params = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
        outputs = []
        async for out in engine.generate([1, 2], params, "a"):
            outputs.append(out)
            if len(outputs) == 2:
                await engine.abort("a")
        assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "abort"
        await until(lambda: engine.stats().kv_blocks_used == 0)
        await engine.shutdown()

    asyncio.run(main())


def test_prompt_errors_raise_on_the_first_anext():
    async def main():
        engine = make(max_model_len=16)
        await engine.start()
        for prompt, reason in (("text", "no tokenizer"), ([], "empty"), ([99], "vocabulary")):
            with pytest.raises(PromptError, match=reason):
                await engine.generate(prompt, GREEDY, "x").__anext__()
        with pytest.raises(PromptError, match="max_model_len"):
            await engine.generate(list(range(16)), GREEDY, "x").__anext__()
        await engine.shutdown()

    asyncio.run(main())


def test_a_full_waiting_queue_refuses_with_queue_full():
    async def main():
        runner = FakeRunner()
        runner.gate = threading.Event()
        engine = make(runner, max_queued=2, max_num_seqs=1)
        await engine.start()
        first = asyncio.create_task(collect(engine, [1, 2], "running"))
        await until(lambda: engine.stats().num_running == 1)  # stuck in the gated step
        queued = [asyncio.create_task(collect(engine, [3], f"q{i}")) for i in range(2)]
        await until(lambda: engine.stats().num_waiting == 2)
        with pytest.raises(QueueFullError):
            await engine.generate([4], GREEDY, "refused").__anext__()
        runner.gate.set()
        for task in [first, *queued]:
            assert (await task)[-1].finished
        await engine.shutdown()

    asyncio.run(main())


def test_shutdown_drains_then_aborts_what_is_left():
    class Slow(FakeRunner):
        def execute(self, chunks):
            time.sleep(0.01)
            return super().execute(chunks)

    async def main():
        engine = make(Slow())
        await engine.start()
        endless = SamplingParams(temperature=0, max_tokens=10**6, ignore_eos=True)
        long = asyncio.create_task(collect(engine, [2], "long", endless))
        await until(lambda: engine.stats().num_running == 1)
        short = asyncio.create_task(collect(engine, [1], "short"))
        await asyncio.sleep(0)
        await engine.shutdown(drain_timeout=0.5)
        assert (await short)[-1].outputs[0].finish_reason == "length"
        assert (await long)[-1].outputs[0].finish_reason == "abort"
        with pytest.raises(QueueFullError, match="shutting down"):
            await engine.generate([1], GREEDY, "late").__anext__()

    asyncio.run(main())


def test_a_failing_step_ends_every_stream_with_engine_dead():
    class Broken(FakeRunner):
        def execute(self, chunks):
            raise RuntimeError("device lost")

    async def main():
        engine = make(Broken())
        await engine.start()
        with pytest.raises(EngineDeadError, match="device lost"):
            await collect(engine, [1], "a")
        with pytest.raises(EngineDeadError):
            await engine.generate([1], GREEDY, "b").__anext__()
        await engine.shutdown(drain_timeout=0)

    asyncio.run(main())


def test_model_identity():
    engine = make()
    assert engine.model_name == "hwrun-default"
    assert engine.vocab_size == 50 and engine.max_model_len == 256
    assert engine.op_table[0].op == "sparse_mla.decode"
