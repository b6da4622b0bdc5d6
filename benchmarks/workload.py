"""The overhead-bound workload, defined exactly as the peers' harness defines it
(``../shared/bench/peers/bench_common.py``), so that its figures and ours compare:

MLP 64 -> 128 -> 128 -> 10 (ReLU), SGD lr 0.01, cross-entropy, batch 32, 32,000 synthetic
samples (1,000 steps per epoch), 3 epochs, one torch thread.
"""

from __future__ import annotations

import os
import time

N_SAMPLES = int(os.environ.get("CADENCE_BENCH_SAMPLES", 32_000))
BATCH = 32
EPOCHS = 3
STEPS_PER_EPOCH = N_SAMPLES // BATCH
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS
DATA_SEED, INIT_SEED, SHUFFLE_SEED = 1234, 0, 42


class Stamper:
    """Times the first forward of epoch 2 and the last forward (steady state)."""

    def __init__(self) -> None:
        self.n = 0
        self.t: dict[int, float] = {}

    def tick(self) -> None:
        self.n += 1
        if self.n in (STEPS_PER_EPOCH + 1, TOTAL_STEPS):
            self.t[self.n] = time.perf_counter()


STAMPS = Stamper()


def load_variant(name: str):
    """The module of variant `name` (``benchmarks/variants/<name>.py``)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent / "variants" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"variant_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_data():
    import torch

    g = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(N_SAMPLES, 64, generator=g)
    w = torch.randn(64, 10, generator=g)
    y = (x @ w + 0.5 * torch.randn(N_SAMPLES, 10, generator=g)).argmax(dim=1)
    return x, y


def make_model():
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128),
                                     nn.ReLU(), nn.Linear(128, 10))

        def forward(self, x):
            STAMPS.tick()
            return self.net(x)

    torch.manual_seed(INIT_SEED)
    return MLP()


def make_sgd(model):
    import torch

    return torch.optim.SGD(model.parameters(), lr=0.01)


def make_loader(x, y):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                      generator=torch.Generator().manual_seed(SHUFFLE_SEED))


def full_loss(model, x, y) -> float:
    import torch

    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))
