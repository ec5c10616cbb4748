"""The offline front end: ``from hwrun import LLM, SamplingParams``."""

import subprocess
import sys

import pytest

from hwrun import LLM, SamplingParams
from hwrun.engine.errors import PromptError

from .fake_runner import FakeRunner
from .test_llm_engine import reference_greedy
from .test_tokenizer import CharTokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=5)


def make_llm(**flags) -> LLM:
    return LLM(runner=FakeRunner(), tokenizer=CharTokenizer(), **flags)


def test_outputs_come_back_in_input_order():
    llm = make_llm(max_num_seqs=2, max_num_batched_tokens=8)
    prompts = [list(range(1, 30)), [3], [4, 5, 6], [7] * 12]
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (7, 2, 5, 1)]
    outputs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [out.prompt_token_ids for out in outputs] == prompts
    assert [out.outputs[0].token_ids for out in outputs] == [
        reference_greedy(p, n) for p, n in zip(prompts, (7, 2, 5, 1), strict=True)
    ]


def test_text_prompts_and_a_single_token_prompt():
    llm = make_llm()
    (out,) = llm.generate("hello", GREEDY, use_tqdm=False)
    assert out.prompt == "hello" and out.outputs[0].text
    (out,) = llm.generate(prompt_token_ids=[1, 2], sampling_params=GREEDY, use_tqdm=False)
    assert out.prompt_token_ids == [1, 2]
    outputs = llm.generate(["ab", "cd"], GREEDY)  # with the progress bar
    assert [out.prompt for out in outputs] == ["ab", "cd"]


def test_a_bad_prompt_starts_nothing():
    llm = make_llm(max_model_len=8)
    with pytest.raises(PromptError, match="max_model_len"):
        llm.generate(prompt_token_ids=[[1], list(range(9))], sampling_params=GREEDY)
    stats = llm.stats()
    assert stats.num_waiting == stats.num_running == stats.prompt_tokens_total == 0


def test_argument_mistakes_are_explained():
    with pytest.raises(TypeError, match="unknown engine options \\['max_num_seq'\\]"):
        make_llm(max_num_seq=3)
    llm = make_llm()
    with pytest.raises(ValueError, match="not both or neither"):
        llm.generate()
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate(["a", "b"], [GREEDY])


def test_importing_hwrun_does_not_import_the_engine():
    code = "import sys, hwrun; print('hwrun.engine' in sys.modules, 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["False", "False"]
