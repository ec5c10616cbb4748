"""The server on the real AsyncEngine, on the reference platform: the embedded default model
(``make serve``), and a tiny random DeepseekV32 checkpoint written by transformers (the engine's
oracle tests use the same builder) with a byte-level BPE tokenizer and a chat template. The HTTP
layer's own behaviour is tested on the fake engine; these check that it holds on the engine that
serves: streaming equals non-streaming for a seed, logprobs and echo, token ids, and a
disconnect frees the request's KV blocks."""

from __future__ import annotations

import json
import time

import pytest

from hwrun.engine.async_engine import AsyncEngine
from hwrun.engine.config import EngineConfig
from tests.engine.tiny_checkpoints import build_tiny_model

from .conftest import RunningServer

pytestmark = pytest.mark.slow
VOCAB = 300
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TEXT = "the quick brown fox jumps over the lazy dog. hello world, serve me tokens.\n"


def write_tokenizer(directory) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([TEXT * 3], trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>"}
    (directory / "tokenizer_config.json").write_text(
        json.dumps({**config, "chat_template": TEMPLATE})
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(path, seed=3, vocab_size=VOCAB, eos_token_id=0)
    write_tokenizer(path)
    return path


@pytest.fixture(scope="module", params=["default model", "tiny checkpoint"])
def real_server(request):
    """The embedded default model (what ``make serve`` serves), and a tiny random checkpoint
    that does not depend on the default model's training."""
    if request.param == "default model":
        config = EngineConfig(platform="reference")
    else:
        path = request.getfixturevalue("checkpoint")
        config = EngineConfig(model=str(path), platform="reference", num_kv_tokens=64 * 64)
    server = RunningServer(AsyncEngine(config, max_queued=64))
    yield server
    server.stop()


def model_of(server) -> str:
    return server.client().models.list().data[0].id


def test_completion_and_chat_on_the_real_engine(real_server):
    client = real_server.client()
    model = model_of(real_server)
    result = client.completions.create(
        model=model, prompt="hello world", max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert result.usage.completion_tokens == 6 and result.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert chat.usage.completion_tokens == 4


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_streaming_equals_non_streaming_for_a_seed(real_server, temperature):
    client = real_server.client()
    kwargs = dict(
        model=model_of(real_server), prompt="the quick brown", max_tokens=12, seed=11,
        temperature=temperature, logprobs=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )  # fmt: skip
    whole = client.completions.create(**kwargs).choices[0]
    chunks = [c for c in client.completions.create(stream=True, **kwargs) if c.choices]
    streamed_ids = [t for c in chunks for t in c.choices[0].model_extra["token_ids"]]
    assert streamed_ids == whole.model_extra["token_ids"]
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    streamed_lps = [lp for c in chunks for lp in c.choices[0].logprobs.token_logprobs]
    assert streamed_lps == whole.logprobs.token_logprobs


def test_chat_streaming_equals_non_streaming_for_a_seed(real_server):
    client = real_server.client()
    kwargs = dict(
        model=model_of(real_server), messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=12, seed=5, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True},
    )  # fmt: skip
    whole = client.chat.completions.create(**kwargs).choices[0]
    chunks = [c for c in client.chat.completions.create(stream=True, **kwargs) if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.message.content
    streamed = [(t.token, t.logprob) for c in chunks for t in c.choices[0].logprobs.content]
    assert streamed == [(t.token, t.logprob) for t in whole.logprobs.content]


def test_echo_with_logprobs_gives_prompt_logprobs(real_server):
    prompt = [5, 6, 7, 8]
    result = real_server.client().completions.create(
        model=model_of(real_server), prompt=prompt, max_tokens=2, echo=True, logprobs=2,
        temperature=0, extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True},
    )  # fmt: skip
    logprobs = result.choices[0].logprobs
    assert logprobs.tokens[:4] == [f"token_id:{t}" for t in prompt]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert len(logprobs.tokens) == 6


def test_disconnect_frees_the_requests_blocks(real_server):
    baseline = real_server.metric("hwrun_kv_blocks_used")
    body = {
        "model": model_of(real_server), "prompt": list(range(1, 200)), "max_tokens": 300,
        "stream": True, "ignore_eos": True,
    }  # fmt: skip
    with real_server.http() as http, http.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        assert real_server.metric("hwrun_kv_blocks_used") > baseline
    deadline = time.monotonic() + 30
    while real_server.metric("hwrun_kv_blocks_used") != baseline:
        assert time.monotonic() < deadline, "blocks not freed"
        time.sleep(0.05)
    assert real_server.metric("hwrun_num_requests_running") == 0


def test_metrics_show_the_engines_op_table(real_server):
    import httpx

    text = httpx.get(real_server.url + "/metrics").text
    assert 'op="sparse_mla.decode"' in text and 'platform="reference"' in text
    assert "hwrun_kv_blocks_total" in text
