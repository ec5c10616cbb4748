"""Byte-exact numeric and row formats: the bytes every plugin reads and writes identically.

Modules, one format family each (docs/formats.md states every rule and byte layout):

- ``fp8``: E4M3 elements; per-tensor, per-group (128) and 128x128-block scales, fp32 or ue8m0.
- ``e4m3fnuz``: E4M3 FNUZ elements (AMD gfx942's fp8) and the exact e4m3fn -> FNUZ boundary
  conversion.
- ``e8m0``: power-of-two scales (bias 127, 0xFF = NaN).
- ``mxfp4``: E2M1 elements with one E8M0 scale per 32 (OCP MX v1.0), FLOOR or RCEIL.
- ``nvfp4``: E2M1 elements with one E4M3 scale per 16 and an fp32 tensor scale.
- ``int4``: W4A16 symmetric int4 with one fp32 scale per 128 along a row.
- ``latent``: one token of one MLA layer's KV cache (bf16, fp8_e4m3, fp8_ds_mla, nvfp4_ds_mla).
- ``index_keys``: one token of the DSA indexer's key cache, and its block-major pages.

Everything is vectorized torch and runs on any device; codes are torch.uint8 and decoding
returns float32.
"""
