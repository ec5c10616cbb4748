"""`hwrun serve` itself, as a user starts it: the embedded default model in a subprocess, the key
from HWRUN_API_KEY, the startup banner, and SIGTERM draining a running stream before exit 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from click.testing import CliRunner

from hwrun.cli import cli

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_hwrun_serve_on_the_default_model_drains_on_sigterm():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-c", "from hwrun.cli import main; main()", "serve", "--port", str(port),
         "--platform", "reference", "--log-level", "warning"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "HWRUN_API_KEY": "sekret"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        assert httpx.get(url + "/v1/models").status_code == 401
        client = openai.OpenAI(base_url=url + "/v1", api_key="sekret", max_retries=0)
        first_chunk = threading.Event()
        result: dict = {}

        def stream() -> None:
            chunks = []
            for chunk in client.completions.create(
                model="hwrun-default", prompt="Once upon a time", max_tokens=200, stream=True,
                extra_body={"ignore_eos": True},
            ):  # fmt: skip
                chunks.append(chunk)
                first_chunk.set()
            result["finish"] = chunks[-1].choices[0].finish_reason
            result["text"] = "".join(c.choices[0].text for c in chunks)

        thread = threading.Thread(target=stream)
        thread.start()
        assert first_chunk.wait(60)
        process.send_signal(signal.SIGTERM)
        assert "finish" not in result  # the stream was still running when the signal came
        thread.join(timeout=120)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert result["finish"] == "length" and result["text"]
    assert f"hwrun serve: {url}/v1  (Authorization: Bearer <key> required)" in err
    assert "model     hwrun-default" in err and "sparse_mla.decode" in err


def test_api_key_from_the_environment_reaches_vllm_hidden():
    result = CliRunner().invoke(
        cli,
        ["serve", "--engine", "vllm", "--platform", "reference", "--model", "m", "--tp", "1",
         "--dry-run"],
        env={"HWRUN_API_KEY": "sekret"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "VLLM_API_KEY=<hidden>" in result.stdout and "sekret" not in result.stdout
