"""Pipeline bubble: the time per step of cadence's pipeline schedules against the theory, and
the activations each pipeline rank holds.

usage: python benchmarks/pipeline_bubble.py [--pp 2 4] [--microbatches 1 4 8 16]
       [--schedules gpipe 1f1b interleaved_1f1b] [--forward-ms 10] [--blocks 8] [--steps 10]
       [--warmup 2] [--out FILE.json] [--smoke]

Each pipeline degree is one ``torchrun --standalone`` job on this machine (gloo, CPU), which
runs every schedule and number of microbatches through cadence's own machinery --
`cadence.engine.pipeline.build_pipeline` and `PipelineExecutor`, as the Task Trainer does. The
model is `--blocks` blocks, split evenly over the stages (``pp`` stages; ``2 pp`` for
interleaved 1F1B, 2 per rank), each of which costs a fixed time per microbatch that does not
use the CPU: a custom autograd function whose forward sleeps t_f and whose backward sleeps
t_b = 2 t_f, on tensors of a few numbers. So 4 ranks on 2 cores measure the schedule, not the
cores they share. The whole model is the same for every schedule: each rank's busy time per
step (the ``ideal``) is ``m x blocks / pp x (t_f + t_b)`` for m microbatches.

Per configuration (the table's columns): the **step** time (every rank leaves a barrier, runs
`PipelineExecutor.run`; the step ends when the last rank returns), the median over `--steps`
steps after `--warmup` (the first builds the stages' buffers); the **ideal**, and the time
a rank's blocks actually slept (**in blocks**: ``time.sleep`` overshoots a little); the
**bubble** measured, ``1 - ideal / step``, and its **theory**; the step the theory predicts,
``ideal / (1 - theory)``, and the **excess** of the measured step over it; the step of the same
schedule with blocks that do not sleep at all (**t_f = 0**: the machinery alone -- Python,
autograd, gloo's sends -- on the critical path).

For GPipe and 1F1B the theory is ``(p - 1) / (m + p - 1)``. For interleaved 1F1B with v
stages per rank the bubble's *time* is divided by v (each stage is 1/v of a rank's work), so
the fraction is ``(p - 1) / (v m + p - 1)`` -- Megatron-LM's, which assumes m is a multiple of
p; for m < p a microbatch crosses all v p stages one after another and the fraction is
``1 - v m / (v p + m - 1)`` (at m = 1 the same as GPipe's).

The activations held: each block counts the microbatches whose forward it ran (with autograd
on) and whose backward has not run yet; a rank's sum over its blocks, at its peak, divided by
its number of blocks, is the peak number of microbatches' activations it holds (a whole
microbatch's for its part of the model each). GPipe holds m on every rank; 1F1B at most
min(m, p - r) on rank r (p on the first: its warm-up runs p - 1 - r forwards, then one more
before the first backward); interleaved 1F1B, whose stages each hold 1/v of a rank's part, runs
(v - 1) r_m + 2 (p - 1 - r) forwards of stages in its warm-up (torch's ``_get_warmup_ops``;
r_m = m / max(1, m // p) microbatches per round), so it holds
min(v m, (v - 1) r_m + 2 (p - 1 - r) + 1) / v microbatches: more than 1F1B.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


# ---------------------------------------------------------------------------- the model


def _model(blocks: int, forward_s: float) -> tuple[Any, Any]:
    """`blocks` sleeping blocks in an ``nn.ModuleList``, with a forward that takes
    ``inputs_embeds`` (as cadence's stages need); and their `Meter` -- one per process, outside
    the modules: each stage is a deep copy of the model."""
    import torch
    from torch import nn

    class Meter:
        """How long the blocks sleep, and what they count: the microbatches each block ran
        forward (with autograd on) and not yet backward, now and at the peak; the time slept."""

        def __init__(self) -> None:
            self.forward_s = forward_s
            self.backward_s = 2 * forward_s
            self.now = 0
            self.peak = 0
            self.forwards = 0
            self.busy_s = 0.0
            """Seconds slept in blocks' forwards and backwards: the rank's measured work."""

        def entered(self) -> None:
            self.now += 1
            self.forwards += 1
            self.peak = max(self.peak, self.now)

        def reset(self) -> None:
            """Between steps: nothing is held (the first step's metadata inference runs the
            first stage's forward with autograd on and no backward through it)."""
            self.now = self.peak = self.forwards = 0
            self.busy_s = 0.0

        def sleep(self, seconds: float, counted: bool) -> None:
            if seconds > 0:
                started = time.perf_counter()
                time.sleep(seconds)
                if counted:
                    self.busy_s += time.perf_counter() - started

    meter = Meter()

    class Sleep(torch.autograd.Function):
        """``x * weight``, sleeping the meter's times in forward and in backward."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, counted: bool
                    ) -> torch.Tensor:
            ctx.save_for_backward(x, weight)
            ctx.counted = counted
            if x.device.type != "meta":
                meter.sleep(meter.forward_s, counted)
            if counted:
                meter.entered()
            return x * weight

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
            x, weight = ctx.saved_tensors
            meter.sleep(meter.backward_s, ctx.counted)
            if ctx.counted:
                meter.now -= 1
            return grad * weight, (grad * x).sum().reshape(weight.shape), None

    class SleepingBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # counted where a backward follows: autograd on (not an evaluation's forward)
            counted = torch.is_grad_enabled() and x.device.type != "meta"
            return Sleep.apply(x, self.weight, counted)

    class SleepingStack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(SleepingBlock() for _ in range(blocks))

        def forward(self, x: torch.Tensor | None = None,
                    inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
            hidden = x if inputs_embeds is None else inputs_embeds
            for block in self.blocks:
                hidden = block(hidden)
            return hidden

    return SleepingStack(), meter


# ---------------------------------------------------------------------------- one rank


def _steps(executor: Any, pipeline: Any, batch: Any, meter: Any, warmup: int, steps: int
           ) -> list[float]:
    """Each step's seconds on this rank, `steps` after `warmup`: every rank leaves a barrier,
    then runs `PipelineExecutor.run` (the meter starts counting after the warm-up)."""
    import torch.distributed as dist

    times = []
    for step in range(warmup + steps):
        if step == warmup:
            meter.reset()
        for parameter in pipeline.model.parameters():
            parameter.grad = None
        dist.barrier()
        started = time.perf_counter()
        executor.run([batch])
        times.append(time.perf_counter() - started)
    return times[warmup:]


def worker(args: argparse.Namespace, out: Path) -> None:
    """One rank of a ``pp``-rank job: every configuration; writes ``rank-<r>.json``."""
    import torch
    import torch.distributed as dist

    import cadence
    from cadence.core.errors import ConfigError
    from cadence.engine.pipeline import PipelineExecutor, build_pipeline

    torch.set_num_threads(1)
    pp = int(os.environ["WORLD_SIZE"])
    runtime = cadence.setup_runtime("cpu", strategy="none", pp=pp)
    options = cadence.ParallelOptions(strategy="none")
    results = []
    for schedule in args.schedules:
        stages_per_rank = 2 if schedule == "interleaved_1f1b" else 1
        for microbatches in args.microbatches:
            figures: dict[str, Any] = {"pp": pp, "schedule": schedule,
                                       "stages_per_rank": stages_per_rank,
                                       "microbatches": microbatches}
            results.append(figures)
            torch.manual_seed(0)
            model, meter = _model(args.blocks, args.forward_ms / 1e3)
            pipeline = build_pipeline(model, runtime, options, stages_per_rank=stages_per_rank)
            try:
                executor = PipelineExecutor(
                    pipeline, lambda batch: batch,
                    lambda labels, outputs: torch.nn.functional.mse_loss(outputs, labels),
                    schedule, microbatches)
            except ConfigError as error:  # torch's schedule's words, after cadence's setting
                figures["refused"] = str(error).split(": ", 1)[-1]
                continue
            batch = (torch.randn(2 * microbatches, 4), torch.randn(2 * microbatches, 4))
            blocks_here = args.blocks // pp
            steps = _steps(executor, pipeline, batch, meter, args.warmup, args.steps)
            figures.update(step_s=steps, held_peak=meter.peak / blocks_here,
                           held_after=meter.now, forwards_per_step=meter.forwards / args.steps
                           / blocks_here, busy_s=meter.busy_s / args.steps)
            meter.forward_s = meter.backward_s = 0.0  # the machinery alone: Python, gloo
            figures["machinery_s"] = _steps(executor, pipeline, batch, meter, 1, args.steps)
            dist.barrier()
    (out / f"rank-{runtime.rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------- the job


def run_pp(pp: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One ``torchrun`` job of `pp` ranks: each configuration's figures, the ranks' merged
    (a step's time is its slowest rank's)."""
    with tempfile.TemporaryDirectory(prefix=f"cadence-bubble-{pp}-") as folder:
        out = Path(folder)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={pp}", __file__, "--worker", "--out-dir", str(out),
                   "--forward-ms", str(args.forward_ms), "--blocks", str(args.blocks),
                   "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--schedules", *args.schedules,
                   "--microbatches", *map(str, args.microbatches)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
        if result.returncode != 0:
            raise SystemExit(f"pp={pp} failed:\n{result.stderr[-4000:]}")
        ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(pp)]
    merged = []
    per_rank = ("held_peak", "held_after", "forwards_per_step", "busy_s")
    for configurations in zip(*ranks):
        figures = {key: value for key, value in configurations[0].items()
                   if key not in ("step_s", "machinery_s", *per_rank)}
        if "refused" not in figures:
            for key in ("step_s", "machinery_s"):
                figures[key] = [max(step) for step in
                                zip(*(rank[key] for rank in configurations))]
            for key in per_rank:
                figures[key] = [rank[key] for rank in configurations]
            _add_figures(figures, args)
        merged.append(figures)
    return merged


def theory(pp: int, stages_per_rank: int, microbatches: int) -> float:
    """The bubble's fraction of a step (see the module docstring)."""
    p, v, m = pp, stages_per_rank, microbatches
    if v > 1 and m < p:
        return 1 - v * m / (v * p + m - 1)
    return (p - 1) / (v * m + p - 1)


def held_theory(schedule: str, pp: int, microbatches: int) -> list[float]:
    """The most microbatches' activations each rank holds, by the schedule (see the module
    docstring)."""
    p, m = pp, microbatches
    if schedule == "gpipe":
        return [float(m)] * p
    if schedule == "1f1b":
        return [float(min(m, p - rank)) for rank in range(p)]
    v, per_round = 2, m // max(1, m // p)
    return [min(v * m, (v - 1) * per_round + 2 * (p - 1 - rank) + 1) / v for rank in range(p)]


def _add_figures(figures: dict[str, Any], args: argparse.Namespace) -> None:
    pp, m = figures["pp"], figures["microbatches"]
    step = statistics.median(figures["step_s"])
    ideal = m * args.blocks / pp * 3 * args.forward_ms / 1e3  # t_f + t_b = 3 t_f per block
    expected = theory(pp, figures["stages_per_rank"], m)
    figures.update(median_s=step, ideal_s=ideal, bubble=1 - ideal / step, theory=expected,
                   theory_s=ideal / (1 - expected), excess_s=step - ideal / (1 - expected),
                   machinery_median_s=statistics.median(figures["machinery_s"]),
                   held_theory=held_theory(figures["schedule"], pp, m))


def table(results: list[dict[str, Any]]) -> str:
    """The figures as a markdown table (`--help` of the columns: the module docstring)."""
    lines = ["| pp | schedule | m | step ms median [min-max] | ideal ms | in blocks ms | "
             "bubble measured | bubble theory | step at theory ms | excess ms | "
             "step at t_f = 0 ms | activations held, microbatches (rank 0, 1, ...) | "
             "held theory |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for figures in results:
        head = f"| {figures['pp']} | {figures['schedule']} | {figures['microbatches']} |"
        if "refused" in figures:
            lines.append(f"{head} refused: {figures['refused']} |" + " |" * 9)
            continue
        steps = [1e3 * s for s in figures["step_s"]]
        held, expected = (", ".join(f"{value:g}" for value in figures[key])
                          for key in ("held_peak", "held_theory"))
        lines.append(
            f"{head} {1e3 * figures['median_s']:.1f} [{min(steps):.1f}-{max(steps):.1f}] | "
            f"{1e3 * figures['ideal_s']:.0f} | {1e3 * statistics.fmean(figures['busy_s']):.0f} | "
            f"{figures['bubble']:.3f} | {figures['theory']:.3f} | "
            f"{1e3 * figures['theory_s']:.0f} | {1e3 * figures['excess_s']:+.0f} | "
            f"{1e3 * figures['machinery_median_s']:.1f} | "
            f"{held} | {expected} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--forward-ms", type=float, default=10.0,
                        help="t_f, each block's forward sleep per microbatch (backward: 2 t_f)")
    parser.add_argument("--blocks", type=int, default=8, help="the whole model's blocks")
    parser.add_argument("--steps", type=int, default=10, help="steps measured")
    parser.add_argument("--warmup", type=int, default=2, help="steps before them")
    parser.add_argument("--smoke", action="store_true",
                        help="pp=2, GPipe and 1F1B with 1 and 4 microbatches, 2 blocks, "
                        "t_f 1 ms, 2 steps: seconds; figures meaningless")
    parser.add_argument("--out", help="write the figures here (JSON)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.pp, args.schedules, args.microbatches = [2], ["gpipe", "1f1b"], [1, 4]
        args.blocks, args.forward_ms, args.steps, args.warmup = 2, 1.0, 2, 1
    if args.worker:
        worker(args, Path(args.out_dir))
        return
    for pp in args.pp:
        stages = pp * (2 if "interleaved_1f1b" in args.schedules else 1)
        if pp < 2 or args.blocks % stages:
            parser.error(f"--blocks {args.blocks} must split evenly into the stages of pp={pp} "
                         f"({stages}), and pp (got {pp}) must be 2 or more: give --blocks a "
                         f"multiple of {stages} instead.")
    results = []
    started = time.perf_counter()
    for pp in args.pp:
        begun = time.perf_counter()
        results += run_pp(pp, args)
        print(f"pp={pp}: {time.perf_counter() - begun:.0f} s", file=sys.stderr)
    print(table(results))
    print(f"\nt_f {args.forward_ms:g} ms, t_b {2 * args.forward_ms:g} ms per block and "
          f"microbatch, {args.blocks} blocks, {args.steps} steps after {args.warmup}; "
          f"{time.perf_counter() - started:.0f} s in all.")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "forward_ms": args.forward_ms, "backward_ms": 2 * args.forward_ms,
            "blocks": args.blocks, "steps": args.steps, "warmup": args.warmup,
            "results": results}, indent=1))


if __name__ == "__main__":
    main()
