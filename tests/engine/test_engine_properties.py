"""Random workloads over the fake runner: whatever the pool, budget, caching and aborts, every
request that is not aborted gets exactly its reference tokens, and the block manager's books
balance after every step."""

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwrun.engine.llm_engine import LLMEngine
from hwrun.engine.sampling_params import SamplingParams

from .conftest import make_engine
from .fake_runner import FakeRunner
from .test_llm_engine import reference_greedy, reference_sampled


def check_books(engine: LLMEngine) -> None:
    manager = engine.block_manager
    owners = Counter(b for seq in engine.scheduler.running for b in seq.block_table)
    assert all(not seq.block_table for seq in engine.scheduler.waiting)
    for block in manager.blocks:
        assert block.ref_count == owners[block.block_id], block
        assert (block.block_id in manager.free) == (block.ref_count == 0), block
    for key, block_id in manager.cached.items():
        assert manager.blocks[block_id].key == key
    for seq in engine.scheduler.running:
        assert len(seq.block_table) * manager.block_size >= seq.num_computed_tokens


prompt = st.one_of(
    st.lists(st.integers(0, 49), min_size=1, max_size=30),
    st.integers(0, 3).flatmap(  # prompts that share prefixes
        lambda n: st.lists(st.integers(0, 49), max_size=6).map(
            lambda tail: [(3 * i + n) % 50 for i in range(9 + 4 * n)] + tail
        )
    ),
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    prompts=st.lists(prompt, min_size=1, max_size=6),
    max_tokens=st.lists(st.integers(1, 8), min_size=6, max_size=6),
    seeded=st.lists(st.booleans(), min_size=6, max_size=6),
    block_size=st.sampled_from([1, 2, 4, 8]),
    spare_blocks=st.integers(0, 12),
    budget=st.integers(1, 24),
    max_num_seqs=st.integers(1, 6),
    caching=st.booleans(),
    abort_at=st.one_of(st.none(), st.tuples(st.integers(0, 5), st.integers(0, 10))),
    async_scheduling=st.booleans(),
)
def test_random_workloads_give_the_reference_tokens(
    prompts,
    max_tokens,
    seeded,
    block_size,
    spare_blocks,
    budget,
    max_num_seqs,
    caching,
    abort_at,
    async_scheduling,
):
    longest = max(len(p) + n for p, n in zip(prompts, max_tokens, strict=False))
    num_blocks = -(-longest // block_size) + spare_blocks
    runner = FakeRunner(num_blocks=num_blocks, block_size=block_size, max_model_len=10**6)
    engine = make_engine(
        runner,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=caching,
        async_scheduling=async_scheduling,
    )
    params = [
        SamplingParams(temperature=0.8, seed=i, max_tokens=n)
        if seed
        else SamplingParams(temperature=0, max_tokens=n)
        for i, (n, seed) in enumerate(zip(max_tokens, seeded, strict=False))
    ][: len(prompts)]
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), p, sp)
    final, aborted = {}, None
    for step in range(2000):
        if not engine.has_unfinished_requests():
            break
        if abort_at is not None and step == abort_at[1] and str(abort_at[0]) in engine.requests:
            aborted = str(abort_at[0])
            engine.abort_request(aborted)
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.outputs[0].token_ids
        check_books(engine)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_used_blocks == 0
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        if str(i) == aborted:
            continue
        want = (
            reference_sampled(p, sp) if sp.seed is not None else reference_greedy(p, sp.max_tokens)
        )
        assert final[str(i)] == want
