"""Distributed ops over a :class:`~hwrun.collectives.communicator.Communicator`.

:mod:`~hwrun.collectives.dcp`: decode context parallelism (token sharding, ``gather_context``,
the exact ``topk_merge``, ``lse_combine``). :mod:`~hwrun.collectives.tsp`: token-sharded
prefill (``heads_to_tokens`` / ``tokens_to_heads`` with the balanced causal split).
:mod:`~hwrun.collectives.launch`: W local gloo processes, for tests and benchmarks.
"""
