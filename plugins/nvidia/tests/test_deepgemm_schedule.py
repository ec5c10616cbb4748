"""The DeepGEMM adapter's schedule reuse, against a fake ``deep_gemm`` that counts its calls:
the schedule of the last call is reused only for the same lengths (same storage, shape,
strides and version), never across an in-place write, a new tensor or an inference tensor."""

from __future__ import annotations

import types

import torch

from hwrun_nvidia import deepgemm


def _fake():
    calls = []

    def get_paged_mqa_logits_metadata(lens, block_size, sms):
        calls.append(lens.clone())
        return torch.full((sms + 1, 2), len(calls), dtype=torch.int32)

    return types.SimpleNamespace(get_paged_mqa_logits_metadata=get_paged_mqa_logits_metadata), calls


def test_reused_for_the_same_lengths_only(monkeypatch):
    monkeypatch.setattr(deepgemm, "_last_schedule", None)
    fake, calls = _fake()
    lens = torch.tensor([[5], [9], [130]], dtype=torch.int32)
    first = deepgemm.schedule(fake, lens, 64, 132)
    # every layer of a step: another view of the same lengths
    assert deepgemm.schedule(fake, lens.view(3, 1), 64, 132) is first
    assert deepgemm.schedule(fake, lens[:, :], 64, 132) is first
    assert len(calls) == 1
    # other block size or SM count, or a prefix of the rows: another schedule
    deepgemm.schedule(fake, lens, 64, 78)
    deepgemm.schedule(fake, lens[:2], 64, 78)
    assert len(calls) == 3
    again = deepgemm.schedule(fake, lens, 64, 132)
    assert len(calls) == 4 and again is not first
    lens[1, 0] = 10  # an in-place write: the next step's lengths in the same buffer
    deepgemm.schedule(fake, lens, 64, 132)
    assert len(calls) == 5 and calls[-1][1, 0].item() == 10
    equal = lens.clone()  # equal values, another tensor
    deepgemm.schedule(fake, equal, 64, 132)
    assert len(calls) == 6


def test_inference_tensors_always_computed(monkeypatch):
    monkeypatch.setattr(deepgemm, "_last_schedule", None)
    fake, calls = _fake()
    with torch.inference_mode():
        lens = torch.tensor([[5], [9]], dtype=torch.int32)
        deepgemm.schedule(fake, lens, 64, 132)
        deepgemm.schedule(fake, lens, 64, 132)
    assert len(calls) == 2
