"""Lifecycle and failure handling on the fake engine: disconnects free KV blocks, a full queue
answers 503, a failing request fails alone, the API key, metrics, and SIGTERM draining."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from .fake_engine import FakeAsyncEngine, FakeTokenizer

MODEL = "hwrun-default"
SLOW = dict(tokenizer=FakeTokenizer(), step_s=0.05)


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


def test_disconnect_mid_stream_aborts_and_frees_blocks(serve):
    server = serve(FakeAsyncEngine(**SLOW))
    assert server.metric("hwrun_kv_blocks_used") == 0
    body = {"model": MODEL, "prompt": "x" * 40, "max_tokens": 200, "stream": True}
    with server.http() as http, http.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert server.metric("hwrun_kv_blocks_used") > 0
        assert server.metric("hwrun_num_requests_running") == 1
    wait_for(lambda: server.metric("hwrun_kv_blocks_used") == 0)
    assert server.metric("hwrun_num_requests_running") == 0
    assert len(server.engine.aborted) == 1 and server.engine.finished == []


def test_disconnect_while_waiting_for_a_whole_response_aborts(serve):
    server = serve(FakeAsyncEngine(**SLOW))
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 200}
    with pytest.raises(httpx.ReadTimeout), server.http(timeout=0.5) as http:
        http.post("/v1/completions", json=body)
    wait_for(lambda: len(server.engine.aborted) == 1)
    wait_for(lambda: server.metric("hwrun_kv_blocks_used") == 0)


def test_full_queue_answers_503_with_retry_after(serve):
    server = serve(FakeAsyncEngine(max_num_seqs=1, max_queued=1, **SLOW))
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 100, "stream": True}
    with server.http() as a, server.http() as b, server.http() as c:
        with a.stream("POST", "/v1/completions", json=body) as running:
            lines = running.iter_lines()  # kept: dropping the iterator closes the connection
            next(lines)
            queued = threading.Thread(target=lambda: b.post("/v1/completions", json=body))
            queued.start()
            wait_for(lambda: server.metric("hwrun_num_requests_waiting") == 1)
            refused = c.post("/v1/completions", json=body)
            assert refused.status_code == 503
            assert refused.headers["Retry-After"] == "1"
            assert "retry" in refused.json()["error"]["message"]
        queued.join(timeout=30)


def test_a_failing_request_fails_alone(server):
    client = server.client()
    with pytest.raises(openai.InternalServerError, match="injected failure"):
        client.completions.create(model=MODEL, prompt="FAIL now", max_tokens=3)
    with pytest.raises(openai.APIError, match="injected failure"):
        list(client.completions.create(model=MODEL, prompt="FAIL now", max_tokens=3, stream=True))
    assert len(client.completions.create(model=MODEL, prompt="fine", max_tokens=3).choices) == 1
    assert server.engine.stats().kv_blocks_used == 0


def test_a_dead_engine_answers_503_and_health_says_so(server):
    with server.http() as http:
        assert http.get("/health").status_code == 200
        server.engine.dead = True
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 503 and "restarted" in response.json()["error"]["message"]
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "engine dead"


def test_api_key_is_required_on_v1_only(serve):
    server = serve(api_key="sekret")
    with pytest.raises(openai.AuthenticationError, match="API key"):
        server.client(api_key="wrong").models.list()
    with server.http() as http:
        assert http.get("/v1/models").status_code == 401
        assert http.get("/v1/models", headers={"Authorization": "sekret"}).status_code == 401
        assert http.get("/health").status_code == 200
        assert http.get("/metrics").status_code == 200
    result = server.client(api_key="sekret").completions.create(
        model=MODEL, prompt="hi", max_tokens=2
    )
    assert len(result.choices) == 1


def test_metrics_report_latencies_tokens_and_op_impls(server):
    server.client().completions.create(model=MODEL, prompt="abcd", max_tokens=5, n=2)
    text = httpx.get(server.url + "/metrics").text
    assert "hwrun_time_to_first_token_seconds_count 2.0" in text
    assert "hwrun_e2e_request_latency_seconds_count 2.0" in text
    assert "hwrun_time_per_output_token_seconds_count 2.0" in text
    assert "hwrun_generation_tokens_total 10.0" in text
    assert "hwrun_prompt_tokens_total 8.0" in text
    assert 'hwrun_request_success_total{finish_reason="length"} 2.0' in text
    assert (
        'hwrun_op_impl_info{fallback="false",impl="triton",op="indexer.topk",platform="nvidia"} 1.0'
        in text
    )
    assert "hwrun_op_fallbacks 1.0" in text
    assert "hwrun_kv_cache_usage_ratio 0.0" in text
    assert 'hwrun_http_requests_total{endpoint="/v1/completions",status="200"} 1.0' in text


def test_startup_banner_names_url_model_platform_and_ops(server):
    from hwrun.serve.server import banner

    text = banner(server.server.state, "127.0.0.1", 8000)
    assert "http://127.0.0.1:8000/v1" in text and "hwrun-default" in text
    assert "nvidia:triton" in text and "reference:reference  (fallback)" in text
    assert "platform  nvidia; reference fallback for 1 op(s)" in text


def _start_process(tmp_path: Path, shutdown_timeout: float) -> tuple[subprocess.Popen, str]:
    port_file = tmp_path / "port"
    script = Path(__file__).with_name("serve_fake.py")
    process = subprocess.Popen(
        [sys.executable, str(script), str(port_file), str(shutdown_timeout)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    wait_for(lambda: port_file.exists() and port_file.read_text(), timeout=60)
    return process, f"http://127.0.0.1:{port_file.read_text()}"


def _stream_in_background(url: str, max_tokens: int) -> tuple[threading.Thread, dict]:
    result: dict = {}
    started = threading.Event()

    def run() -> None:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        chunks = []
        try:
            for chunk in client.completions.create(
                model=MODEL, prompt="drain", max_tokens=max_tokens, stream=True
            ):
                chunks.append(chunk)
                started.set()
        except Exception as err:
            result["error"] = err
        result["text"] = "".join(c.choices[0].text for c in chunks if c.choices)
        result["finish"] = chunks[-1].choices[0].finish_reason if chunks else None
        started.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(30)
    return thread, result


def test_sigterm_drains_running_requests_and_exits_0(tmp_path):
    process, url = _start_process(tmp_path, shutdown_timeout=30)
    try:
        thread, result = _stream_in_background(url, max_tokens=30)  # ~1.5 s of steps
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        try:  # refused: the listening socket is closed, or (if not yet) the server is draining
            late = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x"})
            assert late.status_code == 503
        except httpx.HTTPError:
            pass
        thread.join(timeout=60)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert result.get("error") is None and len(result["text"]) == 30
    assert result["finish"] == "length"
    seen = json.loads(out.strip().splitlines()[-1])
    assert len(seen["finished"]) == 1 and seen["aborted"] == [] and seen["shut_down"]


def test_sigterm_cuts_requests_past_the_shutdown_timeout_and_still_exits_0(tmp_path):
    process, url = _start_process(tmp_path, shutdown_timeout=0.5)
    try:
        thread, result = _stream_in_background(url, max_tokens=200)  # ~10 s of steps
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        thread.join(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert result["finish"] is None or result.get("error") is not None
    seen = json.loads(out.strip().splitlines()[-1])
    assert len(seen["aborted"]) == 1 and seen["finished"] == []
