"""The built-in serving engine: DSA MoE checkpoints run on the op registry of one platform.

One job per module, after nano-vllm: ``config`` (what the user asked for), ``sequence`` (one
request's tokens and state), ``block_manager`` (KV blocks with prefix caching), ``scheduler``
(continuous batching, chunked prefill, preemption), ``model`` (the DeepseekV32 graph of op
contracts), ``model_runner`` (a scheduled step -> logits), ``sampler``, ``llm_engine`` (the step
loop), ``llm`` / ``async_engine`` (front ends). docs/engine.md follows a request through them.
"""
