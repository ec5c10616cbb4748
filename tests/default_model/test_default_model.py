"""The shipped default model is what its card says, loads in transformers as it stands, and
writes Python.

Everything here reads the checkpoint in core/hwrun/default_model through transformers'
`DeepseekV32ForCausalLM` / `AutoTokenizer` only, as any user of the checkpoint would; the last
test checks the training forward (hwrun.default_model.train.dsa_forward) against that same
model, since the weights are only right for inference if the two agree.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DeepseekV32ForCausalLM"):
    pytest.skip("this transformers has no DeepseekV32", allow_module_level=True)

from safetensors import safe_open  # noqa: E402
from transformers import AutoTokenizer, DeepseekV32ForCausalLM  # noqa: E402

from hwrun.default_model import DEFAULT_MODEL_DIR  # noqa: E402

CARD = DEFAULT_MODEL_DIR / "README.md"
SHIPPED = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
)
MAX_BYTES = 20_000_000  # the limit: 20 MB for the whole checkpoint


@pytest.fixture(scope="module")
def loaded():
    model, info = DeepseekV32ForCausalLM.from_pretrained(
        DEFAULT_MODEL_DIR, dtype=torch.float32, output_loading_info=True
    )
    return model.eval(), info


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)


def card_value(name: str) -> str:
    """A row `| name | value |` of the card's summary table."""
    match = re.search(rf"^\| {re.escape(name)} \| ([^|]+) \|", CARD.read_text(), re.MULTILINE)
    assert match, f"the model card has no summary row {name!r}"
    return match.group(1).strip()


def test_every_file_is_shipped_and_the_checkpoint_is_under_20_mb():
    sizes = {name: (DEFAULT_MODEL_DIR / name).stat().st_size for name in SHIPPED}
    checkpoint = sum(size for name, size in sizes.items() if name != "README.md")
    assert checkpoint <= MAX_BYTES, sizes


def test_loads_with_no_missing_or_unexpected_weights(loaded):
    _, info = loaded
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert not info["mismatched_keys"]


def test_architecture_is_a_sparse_attention_moe_with_hwruns_fixed_widths(loaded):
    config = loaded[0].config
    # What hwrun's ops fix: 512 + 64 = 576-wide latent rows, 128-wide index keys.
    assert (config.kv_lora_rank, config.qk_rope_head_dim, config.index_head_dim) == (512, 64, 128)
    # The indexer keeps a small part of the trained context: attention is really sparse.
    assert config.index_topk * 4 <= config.max_position_embeddings
    assert config.n_routed_experts >= 8
    assert config.num_experts_per_tok == 2 and config.n_shared_experts == 1
    assert 1 < config.topk_group < config.n_group
    assert config.first_k_dense_replace == 1
    assert config.mlp_layer_types == ["dense"] + ["sparse"] * (config.num_hidden_layers - 1)
    assert config.routed_scaling_factor != 1.0
    assert config.q_lora_rank is not None


def test_card_states_the_shipped_numbers(loaded):
    model, _ = loaded
    config = model.config
    params = sum(p.numel() for p in model.parameters())
    assert int(card_value("parameters").replace(",", "")) == params
    assert int(card_value("index_topk")) == config.index_topk
    assert int(card_value("trained context")) == config.max_position_embeddings
    assert int(card_value("routed experts")) == config.n_routed_experts
    assert int(card_value("vocabulary")) == config.vocab_size
    size = (DEFAULT_MODEL_DIR / "model.safetensors").stat().st_size
    assert int(card_value("model.safetensors bytes").replace(",", "")) == size


def test_weights_are_bf16_with_fp32_correction_biases():
    with safe_open(DEFAULT_MODEL_DIR / "model.safetensors", framework="pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118
    biases = {n for n in dtypes if n.endswith("e_score_correction_bias")}
    assert biases and all(dtypes[n] == "F32" for n in biases)
    assert {dtypes[n] for n in dtypes if n not in biases} == {"BF16"}
    # The correction biases were trained (auxiliary-loss-free balancing), not left at zero.
    with safe_open(DEFAULT_MODEL_DIR / "model.safetensors", framework="pt") as f:
        assert all(f.get_tensor(n).abs().max() > 0 for n in biases)


@pytest.mark.parametrize(
    "text",
    [
        "def fibonacci(n):\n    if n < 2:\n        return n\n",
        "\tx = {'a': [1, 2.5e-3]}  # tabs, quotes, exponents\r\n",
        "s = 'naïve café – 東京 🐍'\n",
        "    \n\n   trailing spaces   ",
    ],
)
def test_tokenizer_round_trips_text_and_starts_with_bos(tokenizer, text):
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_chat_template_marks_roles(tokenizer):
    messages = [{"role": "user", "content": "Write a loop."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|bos|><|user|>\nWrite a loop.<|end|>\n<|assistant|>\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.convert_tokens_to_ids("<|assistant|>") in ids


def test_greedy_continuation_of_a_function_header_is_python(loaded, tokenizer):
    model, _ = loaded
    prompt = "def fibonacci(n):"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    # A function body: the next line is indented, and Python's own vocabulary shows up.
    assert text.startswith("\n    "), repr(text)
    words = set(re.findall(r"[A-Za-z_]+|\"\"\"|[()\[\]:=]", text))
    assert words & {"return", "if", "for", "n", "self", "None", '"""'}, repr(text)
    assert words & {"(", ")", "[", "]", ":", "="}, repr(text)


def test_predicts_stdlib_style_code_far_better_than_chance(loaded, tokenizer):
    """Next-token loss on a short piece of typical Python, far below uniform (ln 4096 = 8.3)."""
    model, _ = loaded
    code = (
        "import os\n\n\n"
        "def read_lines(path):\n"
        '    """Return the lines of the file at path, without newlines."""\n'
        "    with open(path) as f:\n"
        "        return [line.rstrip('\\n') for line in f]\n\n\n"
        "class Counter:\n"
        "    def __init__(self):\n"
        "        self.count = 0\n\n"
        "    def increment(self):\n"
        "        self.count += 1\n"
        "        return self.count\n"
    )
    ids = tokenizer(code, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert loss < 3.0, loss


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_training_forward_equals_transformers(loaded, tokenizer, mode):
    """The forward the weights were trained with is transformers' own, in both attention modes."""
    from hwrun.default_model.train import dsa_forward

    model, _ = loaded
    text = json.dumps(json.loads((DEFAULT_MODEL_DIR / "config.json").read_text()), indent=1)
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :160]
    assert ids.shape[1] > 2 * model.config.index_topk  # long enough for top-k to drop keys
    indexers = [layer.self_attn.indexer for layer in model.model.layers]
    topk = model.config.index_topk if mode == "sparse" else ids.shape[1]
    for ix in indexers:
        ix.index_topk = topk
    try:
        with torch.no_grad():
            ours = dsa_forward.forward(model, ids, mode).logits
            theirs = model(input_ids=ids).logits
    finally:
        for ix in indexers:
            ix.index_topk = model.config.index_topk
    # fp32 on both sides, same operations in the same order up to the expert sum's grouping.
    torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=1e-4)
