"""The overhead-bound MLP's front-ends against the raw loop IN ONE PROCESS, round after round:
a wall-time ratio that holds to about 1%, where fresh processes (``run.py``, workload 1) spread
by 5-20% and instructions (``instructions.py``) miss what the interpreter's extra code costs in
cache misses (the front-ends' time overhead measured here is 2-3x their instruction overhead).

    python benchmarks/paired.py                     # ~1 min on 2 cores (7 rounds)
    python benchmarks/paired.py --reps 9 --out FILE.json
    python benchmarks/paired.py --smoke             # seconds: keeps it working
    python benchmarks/paired.py --ablation cadence_trainer   # each default's cost: ~2 min

What it does: imports every variant of ``benchmarks/variants/`` it is given, then for each round
(one untimed warm-up round first, the order rotated each round) builds each variant afresh
(new model, loader, trainer, run directory) and times its training call, as ``step.py`` does
in a fresh process. A process's own luck -- its memory layout, the other load on the machine
while it runs -- is shared by every variant of the round, so a round's ratios compare like
with like: ``paired`` is the median over rounds of (raw loop's time / the variant's time) in
the same round; ``ratio`` the ratio of the medians. What it cannot show: start-up and what a
variant does once per process (imports, first-call compiles: the warm-up round runs them) --
``run.py`` measures those.

``--ablation VARIANT`` is the per-step budget of one front-end's defaults: the variant, then the
variant without each of its ``DEFAULTS`` in turn (``cadence_controller-checkpoints`` is the
Controller variant without its checkpoints), then without all of them, each beside the raw loop
in every round. What a default costs is its row's "over raw" less the full variant's.
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


def variant_of(name: str) -> tuple[str, tuple[str, ...]]:
    """``("cadence_trainer", ("checkpoints", "progress"))`` for
    ``cadence_trainer-checkpoints+progress``: a variant, and which of its defaults are off."""
    variant, _, off = name.partition("-")
    return variant, tuple(part for part in off.split("+") if part)


def ablation(variant: str) -> list[str]:
    """The raw loop, `variant`, `variant` without each of its ``DEFAULTS``, without all."""
    import workload  # after --smoke has set its size

    defaults = list(getattr(workload.load_variant(variant), "DEFAULTS", ()))
    if not defaults:
        raise ValueError(f"{variant} declares no DEFAULTS to leave out")
    return (["raw_loop", variant] + [f"{variant}-{default}" for default in defaults]
            + [f"{variant}-{'+'.join(defaults)}"])


def measure(names: list[str], reps: int) -> dict[str, list[float]]:
    """us per step of each variant in each timed round (round order, warm-up dropped)."""
    import torch

    torch.set_num_threads(1)
    import workload
    from run import rounds

    modules = {variant: workload.load_variant(variant)  # each file once, however many rows
               for variant in dict.fromkeys(variant_of(name)[0] for name in names)}
    x, y = workload.make_data()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_, name in rounds(names, reps, warmup=1):
        variant, without = variant_of(name)
        with tempfile.TemporaryDirectory() as workdir:
            train, _ = (modules[variant].build(x, y, workdir, without=without) if without
                        else modules[variant].build(x, y, workdir))
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
    lines = ["| variant | us/step median [min-max] | ratio | paired ratio | over raw, us/step |",
             "|---|---|---|---|---|"]
    for name in names:
        us = times[name]
        paired = statistics.median(b / v for b, v in zip(base, us))
        over = statistics.median(v - b for b, v in zip(base, us))
        lines.append(f"| {name} | {spread(us, '{:.1f}')} | "
                     f"{statistics.median(base) / statistics.median(us):.3f}x | {paired:.3f}x | "
                     f"{over:+.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated names from benchmarks/variants/, the baseline first")
    parser.add_argument("--ablation", metavar="VARIANT",
                        help="the raw loop, VARIANT, and VARIANT without each of its defaults "
                             "(its DEFAULTS): what each one costs per step")
    parser.add_argument("--reps", type=int, default=7, help="timed rounds (after one warm-up)")
    parser.add_argument("--smoke", action="store_true", help="tiny data, one round")
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    names = [name for name in args.variants.split(",") if name]
    if args.smoke:
        os.environ["CADENCE_BENCH_SAMPLES"] = "320"  # read by workload.py at its import
    if args.ablation:
        try:
            names = ablation(args.ablation)
        except (OSError, ValueError) as error:  # no such file, or nothing to leave out
            parser.error(f"--ablation {args.ablation}: {error}")
    unknown = [n for n in names if not (HERE / "variants" / f"{variant_of(n)[0]}.py").is_file()]
    if unknown or args.reps < 1 or not names:
        parser.error(f"unknown variants {unknown}, or --reps (got {args.reps}) below 1")
    import workload

    for name in names:
        variant, without = variant_of(name)
        declared = getattr(workload.load_variant(variant), "DEFAULTS", ()) if without else ()
        if set(without) - set(declared):
            parser.error(f"{name}: {variant} can leave out only {', '.join(declared) or 'nothing'}")
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
