"""Prometheus metrics of one server: the engine's state read at scrape time, request latencies
observed as requests finish, and per op the implementation serving it.

Each server has its own registry (several servers in one process, as in tests, do not share
series). Names follow vLLM's where one exists, under the ``hwrun_`` prefix:

- engine stats, read at scrape time: ``hwrun_num_requests_running`` / ``_waiting``,
  ``hwrun_kv_blocks_used`` / ``_total``, ``hwrun_kv_cache_usage_ratio`` (gauges);
  ``hwrun_prompt_tokens_total``, ``hwrun_generation_tokens_total``,
  ``hwrun_prefix_cache_queries_total`` / ``_hits_total``, ``hwrun_num_preemptions_total``
  (counters); ``hwrun_prefix_cache_hit_rate`` (gauge).
- each engine request as the server saw it (histograms): ``hwrun_time_to_first_token_seconds``,
  ``hwrun_time_per_output_token_seconds``, ``hwrun_e2e_request_latency_seconds``; and
  ``hwrun_request_success_total{finish_reason}``.
- each HTTP response under /v1: ``hwrun_http_requests_total{endpoint,status}``.
- the engine's op table: ``hwrun_op_impl_info{op,impl,platform,fallback}`` (1 per op) and
  ``hwrun_op_fallbacks`` (ops served by the reference fallback).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class EngineCollector(Collector):
    """The engine's counters and op table, read when Prometheus scrapes."""

    def __init__(self, engine: Any):
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats()
        gauges = {
            "hwrun_num_requests_running": ("Requests in the running batch", stats.num_running),
            "hwrun_num_requests_waiting": ("Requests queued for the engine", stats.num_waiting),
            "hwrun_kv_blocks_used": ("KV pool blocks in use", stats.kv_blocks_used),
            "hwrun_kv_blocks_total": ("KV pool blocks", stats.kv_blocks_total),
            "hwrun_kv_cache_usage_ratio": (
                "Fraction of the KV pool in use",
                stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0,
            ),
            "hwrun_prefix_cache_hit_rate": (
                "Share of prompt tokens found in the prefix cache since start",
                stats.prefix_cache_hits / stats.prefix_cache_queries
                if stats.prefix_cache_queries
                else 0.0,
            ),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "hwrun_prompt_tokens": ("Prompt tokens prefilled", stats.prompt_tokens_total),
            "hwrun_generation_tokens": ("Tokens generated", stats.generation_tokens_total),
            "hwrun_prefix_cache_queries": (
                "Prompt tokens looked up in the prefix cache",
                stats.prefix_cache_queries,
            ),
            "hwrun_prefix_cache_hits": (
                "Prompt tokens found in the prefix cache",
                stats.prefix_cache_hits,
            ),
            "hwrun_num_preemptions": (
                "Requests preempted to free KV blocks",
                stats.num_preemptions,
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)

        impls = GaugeMetricFamily(
            "hwrun_op_impl_info",
            "The implementation serving each op (1 per op)",
            labels=["op", "impl", "platform", "fallback"],
        )
        fallbacks = 0
        for choice in self.engine.op_table:
            impls.add_metric(
                [choice.op, choice.impl, choice.platform, str(bool(choice.fallback)).lower()], 1
            )
            fallbacks += bool(choice.fallback)
        yield impls
        yield GaugeMetricFamily(
            "hwrun_op_fallbacks", "Ops served by the reference fallback", value=fallbacks
        )


class ServerMetrics:
    """The server's registry: the engine collector plus what the HTTP layer observes."""

    def __init__(self, engine: Any):
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine))
        self.time_to_first_token = Histogram(
            "hwrun_time_to_first_token_seconds",
            "From the request's arrival at the server to its first generated token",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.time_per_output_token = Histogram(
            "hwrun_time_per_output_token_seconds",
            "Mean time between generated tokens after the first, per request",
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.e2e_latency = Histogram(
            "hwrun_e2e_request_latency_seconds",
            "From the request's arrival at the server to its last token",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.request_success = Counter(
            "hwrun_request_success",
            "Engine requests finished, by finish reason",
            ["finish_reason"],
            registry=self.registry,
        )
        self.http_requests = Counter(
            "hwrun_http_requests",
            "HTTP responses of the API, by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )

    def observe_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(seconds)

    def observe_finished(
        self, finish_reason: str, e2e: float, first_token: float | None, num_tokens: int
    ) -> None:
        self.request_success.labels(finish_reason=finish_reason).inc()
        self.e2e_latency.observe(e2e)
        if first_token is not None and num_tokens > 1:
            self.time_per_output_token.observe((e2e - first_token) / (num_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
