"""A fake AITER for the adapter tests (fake_aiter.py): installed per test, on one architecture."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fake_aiter import FakeAiter

from hwrun_amd import aiter_library


@pytest.fixture
def fake_aiter(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeAiter]:
    """``fake_aiter(arch, moved_logits=True)`` installs a fake release and makes every adapter
    see its tensors on ``arch``."""
    import hwrun_amd.aiter_indexer as indexer

    def install(arch: str = "gfx950", moved_logits: bool = True) -> FakeAiter:
        fake = FakeAiter(arch, moved_logits)
        fake.install(monkeypatch)
        aiter_library.aiter_problem.cache_clear()
        monkeypatch.setattr(indexer, "device_arch", lambda tensor: arch)
        return fake

    yield install
    aiter_library.aiter_problem.cache_clear()
