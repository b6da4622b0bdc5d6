"""Runs ONE overhead-benchmark variant in this fresh process; writes one JSON record.

usage: python benchmarks/step.py VARIANT --out FILE.json --workdir DIR

Only the training call is timed; building the trainer (imports, data, construction) is
reported separately.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant")
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    import workload

    start = time.perf_counter()
    module = workload.load_variant(args.variant)
    x, y = workload.make_data()
    train, final_loss = module.build(x, y, args.workdir)
    built = time.perf_counter()
    torch.set_num_threads(1)
    gc.collect()
    t0 = time.perf_counter()
    train()
    t1 = time.perf_counter()
    stamps = workload.STAMPS
    e2 = workload.STEPS_PER_EPOCH + 1
    record = {
        "variant": args.variant,
        "description": getattr(module, "DESCRIPTION", ""),
        "steps": stamps.n,
        "us_per_step": (t1 - t0) / workload.TOTAL_STEPS * 1e6,
        "steps_per_s": workload.TOTAL_STEPS / (t1 - t0),
        "build_s": built - start,
        "final_loss": final_loss(),
    }
    if {e2, workload.TOTAL_STEPS} <= stamps.t.keys():
        record["steady_us_per_step"] = ((stamps.t[workload.TOTAL_STEPS] - stamps.t[e2])
                                        / (workload.TOTAL_STEPS - e2) * 1e6)
    Path(args.out).write_text(json.dumps(record))


if __name__ == "__main__":
    main()
