"""The overhead-bound MLP's front-ends against the raw loop IN ONE PROCESS, round after round:
a wall-time ratio that holds to about 1%, where fresh processes (``run.py``, workload 1) spread
by 5-20% and instructions (``instructions.py``) miss what the interpreter's extra code costs in
cache misses (the front-ends' time overhead measured here is 2-3x their instruction overhead).

    python benchmarks/paired.py                     # ~3 min on 2 cores
    python benchmarks/paired.py --reps 9 --out FILE.json
    python benchmarks/paired.py --smoke             # seconds: keeps it working

What it does: imports every variant of ``benchmarks/variants/`` it is given, then for each round
(one untimed warm-up round first, the order rotated each round) builds each variant afresh
(new model, loader, trainer, run directory) and times its training call, as ``step.py`` does
in a fresh process. A process's own luck -- its memory layout, the other load on the machine
while it runs -- is shared by every variant of the round, so a round's ratios compare like
with like: ``paired`` is the median over rounds of (raw loop's time / the variant's time) in
the same round; ``ratio`` the ratio of the medians. What it cannot show: start-up and what a
variant does once per process (imports, first-call compiles: the warm-up round runs them) --
``run.py`` measures those.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
VARIANTS = ["raw_loop", "cadence_controller", "cadence_trainer", "cadence_tensorpack",
            "cadence_train_loop"]


def measure(names: list[str], reps: int) -> dict[str, list[float]]:
    """us per step of each variant in each timed round (round order, warm-up dropped)."""
    import torch

    torch.set_num_threads(1)
    import workload
    from run import rounds

    modules = {name: workload.load_variant(name) for name in names}
    x, y = workload.make_data()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_, name in rounds(names, reps, warmup=1):
        with tempfile.TemporaryDirectory() as workdir:
            train, _ = modules[name].build(x, y, workdir)
            gc.collect()
            start = time.perf_counter()
            train()
            seconds = time.perf_counter() - start
        if round_ >= 0:
            times[name].append(seconds / workload.TOTAL_STEPS * 1e6)
    return times


def table(times: dict[str, list[float]]) -> list[str]:
    """The markdown table: the first variant is the baseline."""
    from run import spread

    names = list(times)
    base = times[names[0]]
    lines = ["| variant | us/step median [min-max] | ratio | paired ratio |", "|---|---|---|---|"]
    for name in names:
        us = times[name]
        paired = statistics.median(b / v for b, v in zip(base, us))
        lines.append(f"| {name} | {spread(us, '{:.1f}')} | "
                     f"{statistics.median(base) / statistics.median(us):.3f}x | {paired:.3f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated names from benchmarks/variants/, the baseline first")
    parser.add_argument("--reps", type=int, default=7, help="timed rounds (after one warm-up)")
    parser.add_argument("--smoke", action="store_true", help="tiny data, one round")
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    names = [name for name in args.variants.split(",") if name]
    unknown = [n for n in names if not (HERE / "variants" / f"{n}.py").is_file()]
    if unknown or args.reps < 1 or not names:
        parser.error(f"unknown variants {unknown}, or --reps (got {args.reps}) below 1")
    if args.smoke:
        os.environ["CADENCE_BENCH_SAMPLES"] = "320"  # read by workload.py at its import
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    times = measure(names, 1 if args.smoke else args.reps)
    print("\n".join(table(times)))
    if args.out:
        Path(args.out).write_text(json.dumps({"us_per_step": times, "smoke": args.smoke,
                                              "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                    time.gmtime())}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
