"""Running the application under uvicorn: the startup banner and a graceful SIGTERM.

On SIGTERM (or Ctrl-C) the server stops accepting connections, answers new requests on open
connections with 503, lets running requests finish for up to ``shutdown_timeout`` seconds,
cancels what is left (which aborts those engine requests), shuts the engine down and returns,
so the process exits 0. (uvicorn by itself re-raises the signal after its graceful shutdown,
which would make the exit status 143.)
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Generator
from typing import Any

import uvicorn

from hwrun.serve.app import build_app
from hwrun.serve.routes import ServerState

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


class DrainingServer(uvicorn.Server):
    """uvicorn's server with signals that drain and return instead of re-raising."""

    def __init__(self, config: uvicorn.Config, state: ServerState, announce: bool = True):
        super().__init__(config)
        self.state = state
        self.announce = announce

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            yield
            return
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
                installed.append(sig)
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.announce:
            host = self.config.host
            print(banner(self.state, host, bound_port(self)), file=sys.stderr, flush=True)

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.state.draining = True
        super().handle_exit(sig, frame)


def make_server(
    engine: Any,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    api_key: str | None = None,
    shutdown_timeout: float = 30.0,
    log_level: str = "info",
    announce: bool = True,
) -> DrainingServer:
    """A server for ``engine`` on ``host:port`` (port 0: a free one, see ``bound_port``)."""

    app = build_app(engine, api_key=api_key, shutdown_timeout=shutdown_timeout)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=shutdown_timeout,
        access_log=False,
        backlog=4096,
    )
    return DrainingServer(config, app.state.hwrun, announce)


def bound_port(server: uvicorn.Server) -> int:
    """The port the started server listens on."""
    return server.servers[0].sockets[0].getsockname()[1]


def banner(state: ServerState, host: str, port: int) -> str:
    """URL, model, platform and the impl serving each op (fallbacks marked)."""
    engine = state.engine
    keyed = state.api_key is not None
    shown_host = f"[{host}]" if ":" in host else host
    platforms = sorted({c.platform for c in engine.op_table if not c.fallback})
    fallbacks = [c.op for c in engine.op_table if c.fallback]
    lines = [
        f"hwrun serve: http://{shown_host}:{port}/v1"
        + ("  (Authorization: Bearer <key> required)" if keyed else ""),
        f"  model     {state.model_name} (max_model_len {engine.max_model_len})",
        f"  platform  {', '.join(platforms) or 'reference'}"
        + (f"; reference fallback for {len(fallbacks)} op(s)" if fallbacks else ""),
        "  ops:",
    ]
    width = max((len(c.op) for c in engine.op_table), default=0)
    for choice in engine.op_table:
        tag = "  (fallback)" if choice.fallback else ""
        lines.append(f"    {choice.op:<{width}}  {choice.platform}:{choice.impl}{tag}")
    lines.append(
        "  GET /health, GET /metrics, GET /v1/models, POST /v1/completions, "
        "POST /v1/chat/completions"
    )
    return "\n".join(lines)
