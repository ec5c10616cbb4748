"""KV blocks of the pool: who owns which, and the prefix cache over them.

The model runner fixes ``block_size`` (tokens per block) and ``num_blocks``; a sequence's
``block_table`` lists its blocks in position order (position ``p`` lives in
``block_table[p // block_size]`` at offset ``p % block_size``).

Prefix caching (after vLLM and nano-vllm): once every position of a block is computed, the block
is keyed by a hash of its token ids chained with its prefix's key, so equal keys mean equal
tokens at equal positions from position 0. A new sequence whose leading blocks have cached keys
takes those blocks (reference counted) instead of computing them. A block whose last owner
finishes keeps its key and joins the free queue; it is reused for a new key only when
allocation reaches it, least recently freed first (blocks that never got a key go first). The
last block of a sequence is never taken from the cache, so at least one token is computed and
the runner never writes into a shared block.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from hwrun.engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    key: bytes | None = None  # prefix-cache key once full and computed
    token_ids: list[int] = field(default_factory=list)


def block_key(token_ids: list[int], prefix_key: bytes | None) -> bytes:
    """The prefix-cache key of a full block: its tokens chained with its prefix's key."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(prefix_key or b"")
    digest.update(b"".join(t.to_bytes(8, "little", signed=True) for t in token_ids))
    return digest.digest()


class BlockManager:
    """Allocates a fixed pool of KV blocks to sequences, with an optional prefix cache.

    Counters: ``prefix_cache_queries`` / ``prefix_cache_hits`` count prompt tokens looked up in
    the cache and tokens found there (a sequence looks up once per admission).
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU first
        self.cached: dict[bytes, int] = {}  # key -> block id
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks owned by at least one sequence (free cached blocks are not used)."""
        return self.num_blocks - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Blocks of the cache holding ``seq``'s leading full blocks (all but its last token)."""
        if not self.enable_prefix_caching or seq.needs_prompt_logprobs:
            return []
        matched: list[int] = []
        key = None
        for index in range((seq.num_tokens - 1) // self.block_size):
            token_ids = seq.block_token_ids(index, self.block_size)
            key = block_key(token_ids, key)
            block_id = self.cached.get(key)
            if block_id is None or self.blocks[block_id].token_ids != token_ids:
                break
            matched.append(block_id)
        return matched

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> bool:
        """Whether ``seq`` (after taking ``cached``) can get blocks for ``num_new_tokens`` more
        positions."""
        return self._blocks_needed(seq, num_new_tokens, cached) <= len(self.free)

    def allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> None:
        """Give ``seq`` the cached prefix blocks ``cached`` (from :meth:`match_prefix`, only on
        its first allocation) and new blocks so its table covers ``num_new_tokens`` positions
        after those already computed. Check :meth:`can_allocate` first."""
        if cached:
            assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.can_allocate(seq, num_new_tokens, cached):
            raise RuntimeError(f"out of KV blocks for {seq}: check can_allocate first")
        if not seq.block_table and self.enable_prefix_caching:
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += len(cached) * self.block_size
        key = None
        for block_id in cached:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
            key = block.key
            seq.block_table.append(block_id)
            seq.block_hashes.append(key)
        seq.num_computed_tokens += len(cached) * self.block_size
        target = self.blocks_for(seq.num_computed_tokens + num_new_tokens)
        while len(seq.block_table) < target:
            seq.block_table.append(self._take_free_block())

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Key the blocks of ``seq`` that became full and computed, so later sequences can
        share them."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        for index in range(len(seq.block_hashes), num_full):
            token_ids = seq.block_token_ids(index, self.block_size)
            key = block_key(token_ids, seq.block_hashes[-1] if seq.block_hashes else None)
            seq.block_hashes.append(key)
            block = self.blocks[seq.block_table[index]]
            if key in self.cached:  # computed twice (two sequences at once): keep the first
                continue
            block.key = key
            block.token_ids = token_ids
            self.cached[key] = block.block_id

    def free_sequence(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks: tail first, so its prefix stays cached the longest."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed more often than taken"
            if block.ref_count == 0:
                self.free[block_id] = None
                if block.key is None:  # nothing to keep: reuse it before any cached block
                    self.free.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.table_epoch += 1
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def _blocks_needed(self, seq: Sequence, num_new_tokens: int, cached: list[int]) -> int:
        computed = seq.num_computed_tokens + len(cached) * self.block_size
        have = len(seq.block_table) + len(cached)
        new = max(0, self.blocks_for(computed + num_new_tokens) - have)
        revived = sum(1 for block_id in cached if self.blocks[block_id].ref_count == 0)
        return new + revived

    def _take_free_block(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.key is not None:  # evict: the key no longer names this block's contents
            if self.cached.get(block.key) == block_id:
                del self.cached[block.key]
            block.key = None
            block.token_ids = []
        block.ref_count = 1
        return block_id
