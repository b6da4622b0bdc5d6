"""Input-bound: loading a batch takes as long as computing on it. Without prefetching an epoch
takes N x (load + compute); with cadence's threaded `DataFlow` it should take about
N x max(load, compute).

usage: python benchmarks/input_bound.py {serial,prefetch,train_loop} --batches 40 --out FILE
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("serial", "prefetch", "train_loop"))
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import numpy as np
    import torch

    import cadence

    torch.set_num_threads(1)
    weight = torch.randn(384, 384)

    def compute(x: torch.Tensor) -> torch.Tensor:
        for _ in range(20):
            x = torch.tanh(x @ weight)
        return x

    sample = torch.randn(64, 384)
    compute(sample)
    start = time.perf_counter()
    for _ in range(5):
        compute(sample)
    compute_s = (time.perf_counter() - start) / 5
    load_s = compute_s  # the balanced, worst case for a serial pipeline

    def load(x: np.ndarray) -> tuple[torch.Tensor]:
        time.sleep(load_s)  # decoding, augmentation, a read from storage...
        return (torch.as_tensor(x),)

    arrays = np.random.RandomState(0).randn(args.batches * 64, 384).astype(np.float32)
    flow = cadence.DataFlow.arrays([arrays], 64).map(load)
    if args.kind != "serial":
        flow = flow.threaded(4)
    start = time.perf_counter()
    if args.kind == "train_loop":
        with cadence.TrainLoop(torch.nn.Linear(1, 1), max_epoch=1,
                               print_func=lambda line: None) as loop:
            for _ in loop.iter_epochs():
                for _, (x,) in loop.iter_steps(flow):
                    loop.collect_metrics(out=compute(x).mean())
    else:
        for (x,) in flow:
            compute(x)
    epoch_s = time.perf_counter() - start
    bound = args.batches * max(load_s, compute_s)
    Path(args.out).write_text(json.dumps({"kind": args.kind, "epoch_s": epoch_s,
                                          "bound_s": bound, "ratio": epoch_s / bound,
                                          "load_ms": load_s * 1e3,
                                          "compute_ms": compute_s * 1e3}))


if __name__ == "__main__":
    main()
