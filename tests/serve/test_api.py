"""The API through the official openai client, on the fake engine: models, completions, chat,
streaming, logprobs, echo, token ids, usage."""

from __future__ import annotations

import math

import openai
import pytest

from .fake_engine import FakeAsyncEngine, FakeTokenizer

MODEL = "hwrun-default"


def test_models_lists_the_served_model(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert server.client().models.retrieve(MODEL).id == MODEL


def test_completion_with_usage(server):
    result = server.client().completions.create(model=MODEL, prompt="hello", max_tokens=5)
    assert result.object == "text_completion"
    (choice,) = result.choices
    assert len(choice.text) == 5 and choice.finish_reason == "length"
    assert result.usage.prompt_tokens == 5
    assert result.usage.completion_tokens == 5
    assert result.usage.total_tokens == 10


def test_several_prompts_and_n_give_indexed_choices(server):
    result = server.client().completions.create(
        model=MODEL, prompt=["ab", "cde"], n=2, max_tokens=3, seed=7, temperature=1.0
    )
    assert [c.index for c in result.choices] == [0, 1, 2, 3]
    assert result.usage.prompt_tokens == 5 and result.usage.completion_tokens == 12
    # seed + i per choice: the n samples of one prompt are not copies of each other
    assert result.choices[0].text != result.choices[1].text


def test_token_id_prompts(server):
    client = server.client()
    ids = server.engine.tokenizer.encode("hello")
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0)
    by_text = client.completions.create(model=MODEL, prompt="hello", max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    two = client.completions.create(model=MODEL, prompt=[ids, ids[:2]], max_tokens=2)
    assert len(two.choices) == 2


def test_seeded_sampling_is_reproducible(server):
    client = server.client()
    kwargs = dict(model=MODEL, prompt="x", max_tokens=12, temperature=1.0, seed=123)
    assert client.completions.create(**kwargs).choices[0].text == (
        client.completions.create(**kwargs).choices[0].text
    )


def test_stop_string_ends_the_choice(server):
    client = server.client()
    free = client.completions.create(model=MODEL, prompt="q", max_tokens=8, temperature=0)
    stop = free.choices[0].text[3]
    result = client.completions.create(
        model=MODEL, prompt="q", max_tokens=8, temperature=0, stop=[stop]
    )
    assert result.choices[0].text == free.choices[0].text[: free.choices[0].text.index(stop)]
    assert result.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streaming_equals_non_streaming_for_a_seed(server, endpoint):
    client = server.client()
    if endpoint == "completions":
        kwargs = dict(model=MODEL, prompt="stream me", max_tokens=20, seed=42, logprobs=1)
        whole = client.completions.create(**kwargs)
        chunks = list(client.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
                  for t in c.choices[0].logprobs.tokens]  # fmt: skip
        assert text == whole.choices[0].text
        assert tokens == whole.choices[0].logprobs.tokens
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    else:
        messages = [{"role": "user", "content": "stream me"}]
        kwargs = dict(model=MODEL, messages=messages, max_tokens=20, seed=42, logprobs=True)
        whole = client.chat.completions.create(**kwargs)
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        tokens = [t.token for c in chunks if c.choices and c.choices[0].logprobs
                  for t in c.choices[0].logprobs.content]  # fmt: skip
        assert text == whole.choices[0].message.content
        assert tokens == [t.token for t in whole.choices[0].logprobs.content]


def test_stream_usage_chunk_and_done(server):
    chunks = list(
        server.client().completions.create(
            model=MODEL,
            prompt="abc",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 4 and chunks[-1].usage.prompt_tokens == 3
    with server.http() as http:
        body = {"model": MODEL, "prompt": "abc", "max_tokens": 2, "stream": True}
        text = http.post("/v1/completions", json=body).text
    assert text.rstrip().endswith("data: [DONE]")


def test_completion_logprobs(server):
    result = server.client().completions.create(
        model=MODEL, prompt="abc", max_tokens=4, logprobs=3, temperature=0
    )
    logprobs = result.choices[0].logprobs
    assert "".join(logprobs.tokens) == result.choices[0].text
    assert len(logprobs.token_logprobs) == 4
    rows = zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True)
    for token, lp, top in rows:
        assert lp <= 0 and top[token] == lp and 3 <= len(top) <= 4
    assert logprobs.text_offset == [0, 1, 2, 3]


def test_echo_with_logprobs_returns_prompt_logprobs_first_null(server):
    result = server.client().completions.create(
        model=MODEL, prompt="abc", max_tokens=2, echo=True, logprobs=0, temperature=0
    )
    choice = result.choices[0]
    assert choice.text.startswith("abc") and len(choice.text) == 5
    assert choice.logprobs.tokens[:3] == ["a", "b", "c"]
    assert choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.top_logprobs[0] is None
    assert all(lp is not None for lp in choice.logprobs.token_logprobs[1:])
    streamed = list(
        server.client().completions.create(
            model=MODEL, prompt="abc", max_tokens=2, echo=True, logprobs=0, temperature=0,
            stream=True,
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed) == choice.text
    assert streamed[0].choices[0].logprobs.token_logprobs[0] is None


def test_echo_without_logprobs(server):
    result = server.client().completions.create(model=MODEL, prompt="xyz", max_tokens=3, echo=True)
    assert result.choices[0].text.startswith("xyz")
    assert result.choices[0].logprobs is None


def test_chat_completion_and_top_logprobs(server):
    result = server.client().chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        max_tokens=6,
        logprobs=True,
        top_logprobs=2,
        temperature=0,
    )
    choice = result.choices[0]
    assert choice.message.role == "assistant" and len(choice.message.content) == 6
    assert result.object == "chat.completion"
    rendered = server.engine.tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert result.usage.prompt_tokens == len(rendered)
    for entry in choice.logprobs.content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.bytes == list(entry.token.encode())
        assert math.isfinite(entry.logprob)


def test_chat_default_max_tokens_fills_the_context(serve):
    server = serve(FakeAsyncEngine(tokenizer=FakeTokenizer(), max_model_len=40))
    result = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    prompt = result.usage.prompt_tokens
    assert result.usage.completion_tokens == 40 - prompt
    assert result.choices[0].finish_reason == "length"


def test_tokenizer_less_model_takes_token_ids_and_shows_token_ids(serve):
    server = serve(FakeAsyncEngine(tokenizer=None))
    client = server.client()
    result = client.completions.create(
        model=MODEL,
        prompt=[10, 11, 12],
        max_tokens=3,
        logprobs=1,
        temperature=0,
        extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True},
    )
    choice = result.choices[0]
    token_ids = choice.model_extra["token_ids"]
    assert len(token_ids) == 3
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in token_ids]
    assert choice.model_extra["prompt_token_ids"] == [10, 11, 12]
    assert choice.text == ""
    with pytest.raises(openai.BadRequestError, match="no tokenizer"):
        client.completions.create(model=MODEL, prompt="text", max_tokens=3)
    with pytest.raises(openai.BadRequestError, match="chat template"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])


def test_return_tokens_as_token_ids_with_a_tokenizer(server):
    result = server.client().completions.create(
        model=MODEL, prompt="ab", max_tokens=2, logprobs=0,
        extra_body={"return_tokens_as_token_ids": True},
    )  # fmt: skip
    assert all(t.startswith("token_id:") for t in result.choices[0].logprobs.tokens)


def test_streaming_several_prompts_and_n_interleaves_every_choice(server):
    kwargs = dict(model=MODEL, prompt=["ab", "cde"], n=2, max_tokens=5, seed=3)
    whole = server.client().completions.create(**kwargs)
    texts: dict[int, str] = {}
    finished = {}
    for chunk in server.client().completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert finished == {0: "length", 1: "length", 2: "length", 3: "length"}
