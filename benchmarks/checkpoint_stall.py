"""Checkpoint stall: how long training waits to save ~N MB of state (model + Adam state).

usage: python benchmarks/checkpoint_stall.py KIND --mb 1200 --out FILE.json --workdir DIR
       [--width 2048]

``--width`` is the size of the square layers: 2048 makes few large tensors; 256 makes
thousands of small ones, as a real model's weights and optimizer state are, which is where
per-tensor Python work in a background writer shows.

KIND: ``sync`` (cadence's synchronous save: torch.save + fsync + atomic commit), ``async``
(cadence's asynchronous save: the stall is the copy into host buffers; completion measured
too), ``torch_save`` (a bare torch.save, no fsync), ``floor`` (copy_ into preallocated host
buffers: the least any non-blocking save can stall).

Each kind saves twice and the second save is measured: the steady state of a training run,
where the asynchronous save's host buffers already exist (the first save allocates them).

A background write is not free either: its Python work (pickling, the commit) holds the GIL
that the training thread needs. For ``async``, a small training step (Python-heavy, like the
overhead workload's) runs while the write is in progress; ``lost_s`` = the stall + the time
those steps took beyond their normal speed: what the training actually lost.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _training_probe():
    """One step of a small MLP: ~0.3 ms, mostly Python and small kernels."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("sync", "async", "torch_save", "floor"))
    parser.add_argument("--mb", type=float, default=1200)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--width", type=int, default=2048)
    args = parser.parse_args()

    import torch
    from torch import nn

    import cadence

    torch.set_num_threads(1)  # as in the other workloads: the background write gets a core
    # Adam keeps two moments per parameter: state = 3 x parameters.
    width = args.width
    layers = max(1, round(args.mb * 2**20 / 3 / 4 / (width * width)))
    model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(1, width)).sum().backward()
    optimizer.step()

    class State(cadence.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.optimizer = model, optimizer

    state = State()
    size_mb = sum(t.numel() * t.element_size() for t in state.variables) / 2**20
    record: dict[str, float | str] = {"kind": args.kind, "state_mb": size_mb,
                                      "tensors": len(state.variables)}
    workdir = Path(args.workdir)
    if args.kind == "floor":
        tensors = state.variables
        buffers = [torch.empty_like(t) for t in tensors]
        for _ in range(2):
            t0 = time.perf_counter()
            for buffer, tensor in zip(buffers, tensors):
                buffer.copy_(tensor)
            record["stall_s"] = time.perf_counter() - t0
    elif args.kind == "torch_save":
        for step in range(2):
            t0 = time.perf_counter()
            torch.save(state.state_dict(), workdir / f"state-{step}.pt")
            record["stall_s"] = time.perf_counter() - t0
    else:
        manager = cadence.CheckpointManager(state, workdir, max_to_keep=1,
                                            async_save=args.kind == "async")
        probe = _training_probe()
        t0 = time.perf_counter()
        for _ in range(200):
            probe()
        probe_s = (time.perf_counter() - t0) / 200
        for step in range(2):
            t0 = time.perf_counter()
            manager.save(step)
            stall = record["stall_s"] = time.perf_counter() - t0
            steps, t1 = 0, time.perf_counter()
            while manager.writing:  # train on while the write runs
                probe()
                steps += 1
            during = time.perf_counter() - t1
            manager.wait()
            record["complete_s"] = time.perf_counter() - t0
            record["lost_s"] = stall + max(0.0, during - steps * probe_s)
    Path(args.out).write_text(json.dumps(record))


if __name__ == "__main__":
    main()
