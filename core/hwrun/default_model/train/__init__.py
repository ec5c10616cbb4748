"""How the default model is built, one step a module, each runnable with `python -m`:

1. `build_corpus`: the Python standard library's *.py files, in sorted order, split into train
   and held-out by a hash of each file's path;
2. `train_tokenizer`: a byte-level BPE tokenizer (`tokenizers`) on the train split, and both
   splits encoded to token-id files;
3. `train`: dense pretraining, indexer warm-up, sparse training (DeepSeek-V3.2's recipe for DSA),
   on transformers' DeepseekV32 modules driven by the forward in `dsa_forward`;
4. `export`: the trained weights as a bf16 Hugging Face checkpoint, evaluated with transformers.
"""
