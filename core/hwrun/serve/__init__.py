"""`hwrun serve`: the OpenAI-compatible HTTP layer over the async engine, and the vLLM launcher.

One job per module: ``protocol`` (request bodies as pydantic models, turned into
:class:`~hwrun.engine.sampling_params.SamplingParams`), ``errors`` (OpenAI-style error bodies and
the HTTP status of every refusal), ``prompts`` (text, token ids and chat messages to prompt token
ids, tokens to text), ``streams`` (one HTTP request fanned out to engine requests, aborted together
when the client leaves), ``completions`` and ``chat`` (the two endpoints' responses and SSE
chunks), ``metrics`` (Prometheus), ``routes`` (the endpoints), ``app`` (the FastAPI application:
error handlers, API key), ``server`` (uvicorn, SIGTERM drain, startup banner), ``recipe`` (what a
platform plugin returns from ``hwrun_serve_recipe``) and ``launcher`` (``--engine vllm``).

Importing this package imports nothing heavy: FastAPI and uvicorn load with ``app`` / ``server``.
"""
