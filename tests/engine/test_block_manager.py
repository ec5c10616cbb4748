from hwrun.engine.block_manager import BlockManager, block_key
from hwrun.engine.sampling_params import SamplingParams
from hwrun.engine.sequence import Sequence


def seq(seq_id: int, tokens: list[int]) -> Sequence:
    return Sequence(seq_id, str(seq_id), tokens, SamplingParams(), seed=0)


def compute(manager: BlockManager, s: Sequence, cached: list[int] | None = None) -> None:
    """Allocate every uncomputed token of ``s`` and mark it computed, as a step would."""
    cached = cached or []
    n = s.num_tokens - s.num_computed_tokens - len(cached) * manager.block_size
    manager.allocate(s, n, cached)
    s.num_computed_tokens = s.num_tokens
    manager.cache_full_blocks(s)


def test_block_key_chains_the_prefix():
    assert block_key([1, 2], None) == block_key([1, 2], None)
    assert block_key([1, 2], block_key([3, 4], None)) != block_key([1, 2], block_key([3, 5], None))


def test_allocate_covers_the_positions_and_free_returns_blocks():
    manager = BlockManager(8, 4)
    s = seq(0, list(range(10)))
    assert manager.can_allocate(s, 10)
    manager.allocate(s, 10)
    assert len(s.block_table) == 3 and manager.num_used_blocks == 3
    s.num_computed_tokens = 10
    assert manager.can_allocate(s, 2)  # position 10, 11 still fit block 3
    manager.allocate(s, 2)
    assert len(s.block_table) == 3
    manager.allocate(s, 3)
    assert len(s.block_table) == 4
    manager.free_sequence(s)
    assert manager.num_used_blocks == 0 and s.block_table == [] and s.num_computed_tokens == 0


def test_can_allocate_refuses_more_than_the_pool():
    manager = BlockManager(2, 4)
    assert not manager.can_allocate(seq(0, list(range(9))), 9)


def test_full_blocks_are_shared_and_reference_counted():
    manager = BlockManager(16, 4)
    a = seq(0, list(range(10)))
    compute(manager, a)
    b = seq(1, [*range(8), 99, 98, 97])
    cached = manager.match_prefix(b)
    assert cached == a.block_table[:2]
    compute(manager, b, cached)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert manager.blocks[a.block_table[0]].ref_count == 2
    assert manager.prefix_cache_queries == 10 + 11 and manager.prefix_cache_hits == 8
    manager.free_sequence(a)
    assert manager.blocks[b.block_table[0]].ref_count == 1
    assert manager.num_used_blocks == 3


def test_the_last_token_is_never_served_from_the_cache():
    manager = BlockManager(16, 4)
    a = seq(0, list(range(8)))
    compute(manager, a)
    assert len(manager.match_prefix(seq(1, list(range(8))))) == 1
    assert len(manager.match_prefix(seq(2, list(range(9))))) == 2


def test_freed_blocks_stay_cached_until_evicted_lru():
    manager = BlockManager(4, 2)
    a = seq(0, [1, 2, 3, 4, 5])  # blocks [1 2] [3 4] [5]
    compute(manager, a)
    manager.free_sequence(a)
    assert manager.num_used_blocks == 0
    assert len(manager.match_prefix(seq(1, [1, 2, 3, 4, 9]))) == 2  # still cached
    c = seq(2, [7, 7])  # takes the block that was never cached
    compute(manager, c)
    assert len(manager.match_prefix(seq(3, [1, 2, 3, 4, 9]))) == 2
    d = seq(4, [6, 6, 6, 6])  # takes a never-used block, then evicts [3 4] (freed tail first)
    manager.allocate(d, 4)
    assert len(manager.match_prefix(seq(5, [1, 2, 3, 4, 9]))) == 1
    e = seq(6, [8, 8])  # the last free block is the cached [1 2]: evicted too
    manager.allocate(e, 2)
    assert manager.match_prefix(seq(7, [1, 2, 3, 4, 9])) == []
    assert not manager.can_allocate(seq(8, [1]), 1)


def test_prefix_caching_off_matches_nothing_and_counts_nothing():
    manager = BlockManager(8, 2, enable_prefix_caching=False)
    a = seq(0, [1, 2, 3])
    compute(manager, a)
    assert manager.match_prefix(seq(1, [1, 2, 3])) == []
    assert manager.prefix_cache_queries == 0


def test_reviving_cached_free_blocks_counts_against_the_free_pool():
    manager = BlockManager(3, 2)
    a = seq(0, [1, 2, 3, 4, 5])
    compute(manager, a)
    manager.free_sequence(a)
    b = seq(1, [1, 2, 3, 4, 6, 7])  # 2 cached free blocks + 1 new = all 3
    cached = manager.match_prefix(b)
    assert len(cached) == 2
    assert manager.can_allocate(b, 2, cached)
    assert not manager.can_allocate(b, 3, cached)
