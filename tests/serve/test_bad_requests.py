"""Malformed and out-of-range requests: each gets the right 4xx and a message saying what to fix,
as an OpenAI error body, and the server keeps serving."""

from __future__ import annotations

import pytest

MODEL = "hwrun-default"
LONG = "x" * 300  # the fake engine's max_model_len is 256


def completion(**fields):
    return {"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields}


def chat(**fields):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


# (case, method, path, json body or raw bytes, status, words the message must contain)
CASES = [
    ("malformed JSON", "POST", "/v1/completions", b'{"model": "hwrun-default",', 400,
     "not valid JSON"),
    ("body is an array", "POST", "/v1/completions", b"[1, 2]", 422, "must be a JSON object"),
    ("no body", "POST", "/v1/completions", b"", 422, "no body"),
    ("missing model", "POST", "/v1/completions", {"prompt": "hi"}, 422, "model: Field required"),
    ("missing prompt", "POST", "/v1/completions", {"model": MODEL}, 422, "prompt"),
    ("unknown model", "POST", "/v1/completions", completion(model="gpt-9"), 404,
     "does not exist"),
    ("max_tokens zero", "POST", "/v1/completions", completion(max_tokens=0), 400,
     "max_tokens must be >= 1"),
    ("max_tokens not a number", "POST", "/v1/completions", completion(max_tokens="ten"), 422,
     "max_tokens"),
    ("negative temperature", "POST", "/v1/completions", completion(temperature=-1), 400,
     "temperature must be >= 0"),
    ("top_p zero", "POST", "/v1/completions", completion(top_p=0), 400, "top_p must be in"),
    ("top_p above one", "POST", "/v1/completions", completion(top_p=1.5), 400, "top_p"),
    ("top_k below -1", "POST", "/v1/completions", completion(top_k=-5), 400, "top_k"),
    ("min_p above one", "POST", "/v1/completions", completion(min_p=2), 400, "min_p"),
    ("n zero", "POST", "/v1/completions", completion(n=0), 400, "n must be between"),
    ("n too large", "POST", "/v1/completions", completion(n=100), 400, "n must be between"),
    ("logprobs too many", "POST", "/v1/completions", completion(logprobs=50), 400, "logprobs"),
    ("negative seed", "POST", "/v1/completions", completion(seed=-1), 400, "seed"),
    ("empty prompt", "POST", "/v1/completions", completion(prompt=""), 400, "empty"),
    ("empty prompt list", "POST", "/v1/completions", completion(prompt=[]), 400, "empty"),
    ("token id outside the vocabulary", "POST", "/v1/completions",
     completion(prompt=[5, 999999]), 400, "outside the vocabulary"),
    ("prompt longer than max_model_len", "POST", "/v1/completions", completion(prompt=LONG),
     400, "max_model_len"),
    ("prompt + max_tokens past max_model_len", "POST", "/v1/completions",
     completion(max_tokens=1000), 400, "lower max_tokens"),
    ("mixed prompt list", "POST", "/v1/completions", completion(prompt=["a", 1]), 422,
     "prompt"),
    ("empty stop string", "POST", "/v1/completions", completion(stop=[""]), 400, "stop"),
    ("presence penalty", "POST", "/v1/completions", completion(presence_penalty=1.0), 400,
     "presence_penalty is not supported"),
    ("logit bias", "POST", "/v1/completions", completion(logit_bias={"5": 10}), 400,
     "logit_bias"),
    ("suffix", "POST", "/v1/completions", completion(suffix="end"), 400, "suffix"),
    ("stream_options without stream", "POST", "/v1/completions",
     completion(stream_options={"include_usage": True}), 400, "stream=true"),
    ("no messages", "POST", "/v1/chat/completions", chat(messages=[]), 400, "messages is empty"),
    ("unknown role", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "wizard", "content": "hi"}]), 422, "role"),
    ("image content", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     400, "text only"),
    ("top_logprobs without logprobs", "POST", "/v1/chat/completions", chat(top_logprobs=2),
     400, "needs logprobs=true"),
    ("top_logprobs too many", "POST", "/v1/chat/completions",
     chat(logprobs=True, top_logprobs=30), 400, "top_logprobs must be"),
    ("tools", "POST", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    ("chat prompt too long", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": LONG}]), 400, "max_model_len"),
    ("GET on a POST route", "GET", "/v1/completions", None, 405, "not allowed"),
    ("unknown route", "POST", "/v1/embeddings", {}, 404, "no route"),
    ("unknown model card", "GET", "/v1/models/other", None, 404, "does not exist"),
]  # fmt: skip


@pytest.fixture(scope="module")
def module_server():
    from .conftest import RunningServer
    from .fake_engine import FakeAsyncEngine, FakeTokenizer

    server = RunningServer(FakeAsyncEngine(tokenizer=FakeTokenizer()))
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_request_is_refused_with_a_reason(module_server, method, path, body, status, words):
    with module_server.http() as http:
        if isinstance(body, bytes):
            headers = {"Content-Type": "application/json"}
            response = http.request(method, path, content=body, headers=headers)
        else:
            response = http.request(method, path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"], error["message"]


def test_at_least_twenty_cases():
    assert len(CASES) >= 20


def test_the_server_still_serves_after_every_bad_request(module_server):
    for _, method, path, body, _, _ in CASES:
        with module_server.http() as http:
            if isinstance(body, bytes):
                http.request(method, path, content=body)
            else:
                http.request(method, path, json=body)
    result = module_server.client().completions.create(model=MODEL, prompt="ok", max_tokens=3)
    assert len(result.choices[0].text) == 3
    assert module_server.engine.stats().kv_blocks_used == 0
