"""A snapshot of the engine's load and counters (for ``/metrics`` and progress lines)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    num_running: int  # sequences holding KV blocks (prefilling or decoding)
    num_waiting: int  # queued or preempted sequences
    kv_blocks_total: int
    kv_blocks_used: int  # owned by a sequence; free blocks that keep a cached prefix are not used
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens whose KV was found there
    num_preemptions: int
    prompt_tokens_total: int  # prompt tokens of requests added
    generation_tokens_total: int  # tokens sampled
