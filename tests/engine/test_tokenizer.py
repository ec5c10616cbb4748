"""Tokenizer loading, streaming detokenization, stop strings (in the engine too)."""

import itertools
import json

import pytest

from hwrun.engine.sampling_params import SamplingParams
from hwrun.engine.tokenizer import IncrementalDetokenizer, find_stop_string, load_tokenizer

from .conftest import make_engine, run_all
from .fake_runner import FakeRunner
from .test_llm_engine import reference_greedy

TEXT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def checkpoint_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer saved as a checkpoint ships it, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([TEXT * 3, "café naïve 你好 🙂"], trainer)
    directory = tmp_path_factory.mktemp("checkpoint")
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<eos>",
                "chat_template": TEMPLATE,
            }
        )
    )
    return load_tokenizer(directory)


class CharTokenizer:
    """Token i is the i-th character of ALPHABET (50 tokens: the fake runner's vocabulary)."""

    ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVW"
    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return [self.ALPHABET.index(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.ALPHABET[i] for i in ids)


def test_a_checkpoint_without_tokenizer_json_has_none(tmp_path):
    assert load_tokenizer(tmp_path) is None


def test_checkpoint_tokenizer_round_trips_and_applies_the_chat_template(checkpoint_tokenizer):
    tok = checkpoint_tokenizer
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.eos_token_id == 0 and tok.has_chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert tok.decode(ids) == "<|user|>hi\n<|assistant|>"


def test_incremental_detokenization_streams_the_full_text(checkpoint_tokenizer):
    tok = checkpoint_tokenizer
    prompt = tok.encode("x = ")
    output = tok.encode("café naïve 你好 🙂 " + TEXT)
    detokenizer = IncrementalDetokenizer(tok, prompt)
    pieces = [detokenizer.add(t) for t in output]
    assert "".join(pieces) == tok.decode(output)
    assert all("\ufffd" not in piece for piece in pieces)


def test_find_stop_string_takes_the_earliest_ending_in_the_new_text():
    assert find_stop_string("abc STOP xyz", 4, ("STOP",)) is None  # STOP is all old text
    assert find_stop_string("abc STOP xyz", 4, ("STOP", "xyz")) == ("xyz", 9)
    assert find_stop_string("abc STOP xyz", 8, ("STOP", "xyz")) == ("STOP", 4)
    assert find_stop_string("abcde", 1, ("cde", "e")) == ("cde", 2)
    assert find_stop_string("abcd", 2, ("bc",)) == ("bc", 1)  # straddles old and new


def greedy_text(prompt: list[int], n: int = 30) -> str:
    return CharTokenizer().decode(reference_greedy(prompt, n))


def test_stop_strings_cut_the_text_and_name_the_stop():
    prompt = [1, 2, 3]
    full = greedy_text(prompt)
    stop = full[10:12]
    cut = full.index(stop)
    for include, end in ((False, cut), (True, cut + 2)):
        params = SamplingParams(
            temperature=0, max_tokens=30, stop=(stop,), include_stop_str_in_output=include
        )
        engine = make_engine(tokenizer=CharTokenizer())
        (out,) = run_all(engine, [prompt], params)
        completion = out.outputs[0]
        assert completion.text == full[:end]
        assert completion.finish_reason == "stop" and completion.stop_reason == stop
        assert completion.token_ids == reference_greedy(prompt, 30)[: cut + 2]


def test_streamed_text_never_shows_a_stop_string_it_later_cuts():
    prompt = [4, 4]
    full = greedy_text(prompt)
    stop = full[12:15]
    cut = full.index(stop)
    engine = make_engine(tokenizer=CharTokenizer())
    engine.add_request("a", prompt, SamplingParams(temperature=0, max_tokens=30, stop=(stop,)))
    texts = []
    while engine.has_unfinished_requests():
        texts.extend(out.outputs[0].text for out in engine.step())
    assert texts[-1] == full[:cut]
    for before, after in itertools.pairwise(texts):
        assert after.startswith(before)


def test_text_prompts_go_through_the_tokenizer():
    engine = make_engine(tokenizer=CharTokenizer())
    (out,) = run_all(engine, ["hello world"], SamplingParams(temperature=0, max_tokens=4))
    assert out.prompt == "hello world"
    assert out.prompt_token_ids == CharTokenizer().encode("hello world")
    assert out.outputs[0].text == CharTokenizer().decode(out.outputs[0].token_ids)


def test_eos_and_stop_tokens_are_not_in_the_text():
    prompt = [3, 4, 5]
    greedy = reference_greedy(prompt, 6)
    engine = make_engine(FakeRunner(eos_token_id=greedy[3]), tokenizer=CharTokenizer())
    (out,) = run_all(engine, [prompt], SamplingParams(temperature=0, max_tokens=6))
    first = greedy.index(greedy[3])
    assert out.outputs[0].text == CharTokenizer().decode(greedy[:first])
