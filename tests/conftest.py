import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def compile_counter(monkeypatch):
    """Makes every ``torch.compile`` (cadence's compiled steps too) use a `CountingBackend`, with
    a recompile limit high enough that a step recompiled per step never falls back to eager."""
    import functools

    import torch._dynamo
    from fakes import CountingBackend

    backend = CountingBackend()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    name = next(n for n in ("recompile_limit", "cache_size_limit")
                if hasattr(torch._dynamo.config, n))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(**{name: 64}):
        yield backend
    torch._dynamo.reset()
