"""cadence's `Accuracy` against torchmetrics' ``MulticlassAccuracy``: what an update and a loop's
read cost, and what each costs a whole Task `Trainer` run (``docs/metrics.md`` has the figures
and the decision they support).

    python benchmarks/metrics.py                 # ~5 min on 2 cores; prints a Markdown report
    python benchmarks/metrics.py --smoke         # seconds: keeps it working

1. Per update, in-process (``timeit``, the metrics timed in turn, median of the rounds, one
   torch thread): the workload's batch
   (32 examples, 10 classes) and a large one (1,024 x 1,000); the aten ops an update runs (each
   one kernel launch on a GPU), counted with a ``TorchDispatchMode``.
2. Per loop: 100 updates (10 with ``--smoke``) and the one read of the result (cadence
   ``result()``, torchmetrics ``compute()``), and the read alone.
3. Whole run: the overhead-bound workload (``benchmarks/workload.py``) through the Task Trainer
   with no metric, cadence's accuracy, and torchmetrics', each in fresh processes
   (``benchmarks/step.py``), rounds interleaved.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ["cadence_trainer", "cadence_trainer_accuracy", "cadence_trainer_torchmetrics"]


def metrics(classes: int) -> dict:
    import torchmetrics.classification as tmc

    import cadence

    return {
        "cadence Accuracy": lambda: cadence.Accuracy(),
        "torchmetrics micro, validate_args=False": lambda: tmc.MulticlassAccuracy(
            classes, average="micro", validate_args=False),
        "torchmetrics micro (defaults but average)": lambda: tmc.MulticlassAccuracy(
            classes, average="micro"),
        "torchmetrics macro (its default)": lambda: tmc.MulticlassAccuracy(classes),
    }


def update_fn(metric):
    import cadence

    if isinstance(metric, cadence.Metric):
        return lambda labels, outputs: metric.update_state(labels, outputs)
    return lambda labels, outputs: metric.update(outputs, labels)


def read_fn(metric):
    import cadence

    return metric.result if isinstance(metric, cadence.Metric) else metric.compute


def count_ops(fn) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.ops


def interleaved(fns: dict[str, object], number: int, rounds: int) -> dict[str, float]:
    """Median seconds per call of each function, the functions timed in turn in every round
    (the noise of a shared machine falls on all of them alike)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timeit.timeit(fn, number=number) / number)
    return {name: statistics.median(values) for name, values in times.items()}


def filler(make, labels, outputs, updates=100):
    """A function that makes the metric and updates it `updates` times."""

    def filled():
        fresh = make()
        step = update_fn(fresh)
        for _ in range(updates):
            step(labels, outputs)
        return fresh

    return filled


def micro(smoke: bool) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    rows = []
    number, rounds = (20, 3) if smoke else (200, 21)
    loop_updates = 10 if smoke else 100  # a loop's updates before its read
    for batch, classes in ((32, 10), (1024, 1000)):
        outputs = torch.randn(batch, classes)
        labels = torch.randint(0, classes, (batch,))
        makers = metrics(classes)
        updates, loops, reads, row = {}, {}, {}, {}
        for name, make in makers.items():
            update = update_fn(make())
            update(labels, outputs)  # the accumulators exist
            updates[name] = functools.partial(update, labels, outputs)
            filled = filler(make, labels, outputs, loop_updates)
            loops[name] = lambda filled=filled: read_fn(filled())()
            row[name] = {"shape": f"{batch} x {classes}", "metric": name,
                         "loop_updates": loop_updates,
                         "ops": count_ops(updates[name]), "read_ops": count_ops(
                             read_fn(filled()))}
            pool = [read_fn(filled()) for _ in range(rounds * 3)]  # each read once: no cache
            reads[name] = pool
        per_update = interleaved(updates, number, rounds)
        per_loop = interleaved(loops, max(1, number // loop_updates), rounds)
        for name in makers:
            row[name]["update_us"] = per_update[name] * 1e6
            row[name]["loop_us"] = per_loop[name] * 1e6
            row[name]["read_us"] = statistics.median(
                timeit.timeit(read, number=1) for read in reads[name]) * 1e6
            rows.append(row[name])
    return rows


def whole_runs(smoke: bool) -> dict[str, list[float]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               CADENCE_BENCH_SAMPLES="3200" if smoke else "32000")
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    from run import fork_children_if_smoke, rounds, run_json

    # Without a GPU, each smoke child is forked from a process that imported torch and cadence.
    fork_children_if_smoke(smoke)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "children.log"
        for r, name in rounds(VARIANTS, 1 if smoke else 5, 0):
            out = Path(tmp) / f"{name}-{r}.json"
            workdir = Path(tmp) / f"{name}-{r}"
            workdir.mkdir()
            command = [sys.executable, str(HERE / "step.py"), name, "--out", str(out),
                       "--workdir", str(workdir)]
            record = run_json(command, out, env, log, timeout=600)
            if record is None:
                raise RuntimeError(f"{' '.join(command)} failed:\n{log.read_text()[-5000:]}")
            results[name].append(record.get("steady_us_per_step", record["us_per_step"]))
    return results


def report(rows: list[dict], runs: dict[str, list[float]]) -> str:
    lines = ["## Per update and per loop (one thread, median)", "",
             "| batch x classes | metric | aten ops / update | us / update | "
             f"us / loop ({rows[0]['loop_updates']} updates + read) | us / read | "
             "aten ops / read |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['shape']} | {r['metric']} | {r['ops']} | {r['update_us']:.1f} | "
              f"{r['loop_us']:.0f} | {r['read_us']:.1f} | {r['read_ops']} |" for r in rows]
    base = statistics.median(runs["cadence_trainer"])
    lines += ["", "## Whole run: Task Trainer, overhead-bound MLP (steady us / step, median of "
              f"{len(runs['cadence_trainer'])} fresh processes)", "",
              "| variant | us / step | vs no metric |", "|---|---|---|"]
    for name, values in runs.items():
        median = statistics.median(values)
        lines.append(f"| {name} | {median:.1f} | {median - base:+.1f} us |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--no-runs", action="store_true", help="skip the whole-run part")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    # The whole runs first: with --smoke they fork this process, before it computed anything.
    runs = ({name: [0.0] for name in VARIANTS} if args.no_runs else whole_runs(args.smoke))
    rows = micro(args.smoke)
    print(report(rows, runs))


if __name__ == "__main__":
    main()
