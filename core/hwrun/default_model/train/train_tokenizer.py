"""A byte-level BPE tokenizer for the corpus, and the corpus encoded with it.

Trained with `tokenizers` on the train split only. Every document is encoded as
`<|bos|> text <|eos|>`; the token ids of each split are concatenated into a uint16 file
(`train.bin`, `heldout.bin`). The tokenizer is saved as tokenizer.json plus a
tokenizer_config.json that transformers' AutoTokenizer loads (PreTrainedTokenizerFast), with a
chat template over the role markers.

    python -m hwrun.default_model.train.train_tokenizer --corpus build/corpus --out build/data
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 4096
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLES = ("<|system|>", "<|user|>", "<|assistant|>")
END_OF_TURN = "<|end|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, *ROLES, END_OF_TURN]  # ids 0..6, in this order

# A turn is `<|role|>\n content <|end|>\n`; the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def read_texts(path: Path) -> Iterator[str]:
    with path.open() as f:
        for line in f:
            yield json.loads(line)["text"]


def train_tokenizer(corpus: Path, vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(read_texts(corpus / "train.jsonl"), trainer)
    # A plain `tokenizer(text)` starts with <|bos|>, as every training document does.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    return tok


def tokenizer_config(model_max_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": [*ROLES, END_OF_TURN],
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(tok: Tokenizer, out: Path, model_max_length: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = tokenizer_config(model_max_length)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def encode_split(tok: Tokenizer, jsonl: Path, out: Path) -> int:
    """Writes `<|bos|> ids <|eos|>` for every document of a split as uint16; returns the count."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    texts = list(read_texts(jsonl))
    chunks = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        chunks.append(np.asarray([bos, *enc.ids, eos], dtype=np.uint16))
    ids = np.concatenate(chunks)
    ids.tofile(out)
    return int(ids.size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    parser.add_argument("--model-max-length", type=int, default=512)
    args = parser.parse_args()
    tok = train_tokenizer(args.corpus, args.vocab_size)
    save_tokenizer(tok, args.out, args.model_max_length)
    counts = {
        split: encode_split(tok, args.corpus / f"{split}.jsonl", args.out / f"{split}.bin")
        for split in ("train", "heldout")
    }
    corpus = json.loads((args.corpus / "corpus.json").read_text())
    meta = {"vocab_size": tok.get_vocab_size(), "tokens": counts, "corpus": corpus}
    (args.out / "data.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps({"vocab_size": meta["vocab_size"], "tokens": counts}))


if __name__ == "__main__":
    main()
