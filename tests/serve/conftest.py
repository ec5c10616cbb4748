"""Servers for the serve tests: uvicorn on a free loopback port, in a thread of the test process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from hwrun.serve.server import bound_port, make_server

from .fake_engine import FakeAsyncEngine, FakeTokenizer

START_TIMEOUT_S = 60


class RunningServer:
    """A server started on 127.0.0.1 with a free port; ``stop()`` shuts it down."""

    def __init__(self, engine, **options):
        self.engine = engine
        self.server = make_server(
            engine, host="127.0.0.1", port=0, log_level="warning", announce=False, **options
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{bound_port(self.server)}"

    def client(self, api_key: str = "unused", **options) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **options)

    def http(self, timeout: float = 30, **options) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, **options)

    def metric(self, name: str) -> float:
        """The value of an unlabelled series in /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture
def serve() -> Iterator:
    """``serve(engine, **options)`` starts a server; every one is stopped after the test."""
    servers: list[RunningServer] = []

    def start(engine=None, **options) -> RunningServer:
        engine = engine or FakeAsyncEngine(tokenizer=FakeTokenizer())
        servers.append(RunningServer(engine, **options))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(serve) -> RunningServer:
    return serve()
