"""Instructions per training step of each front-end, counted by callgrind: a figure that does
not move with the machine's load, to show that a change did not make a step more expensive.

    python benchmarks/instructions.py --out FILE.json
    python benchmarks/instructions.py --variants raw_loop,cadence_controller --steps 300 \\
        --out FILE.json
    PYTHONPATH=/path/to/other/checkout python benchmarks/instructions.py --out FILE.json

What it measures: each variant of ``benchmarks/variants/`` (the overhead-bound MLP of
``workload.py``, one torch thread) runs twice, each time in a fresh process under
``valgrind --tool=callgrind`` (whole program, ``--instr-atstart=yes``): once training FIRST
steps and once FIRST + STEPS steps, in one epoch both times, on the same data (the same
tensors; the loader takes the first ``steps x 32`` samples). Both processes do the same start-up,
imports, data and trainer construction, the same epoch begin and end and the same end of
training, so these cancel in

    instructions per step = (Ir(FIRST + STEPS) - Ir(FIRST)) / STEPS

What is left is the per-step work, including what a front-end does every k steps (summaries
every 100 steps) at its rate. FIRST is 50, not 0: the tensorpack front-end refuses an epoch of
0 steps, and a run of 0 epochs would leave the epoch's own work (the loader's shuffle, the
per-epoch checkpoint of TrainLoop and SimpleTrainer) in the difference.

How to read it: ``instructions_per_step`` per variant and ``ratio_to_raw_loop``, the variant's
count over the hand-written loop's (1.03 = 3% more instructions per step). A rerun of the same
checkout repeats to within a few instructions per step (~1 in 10^6), but another checkout of
the same code differs by up to ~0.04% (the raw loop: 2,665,228 vs 2,666,185), and by up to
~0.15% when its path has another length: compare two versions from checkouts at paths of the
same length, run side by side. Instructions are not time (cache misses and the torch kernels'
speed are not in them). The cadence measured is whichever ``import cadence`` finds, so
``PYTHONPATH=<checkout>`` measures another checkout; ``cadence`` in the output names it. One
variant takes 4-7 minutes on 2 busy cores, the five ~25 minutes (valgrind is single-threaded
and ~50x slow).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ["raw_loop", "cadence_controller", "cadence_tensorpack", "cadence_train_loop",
            "cadence_trainer"]
FIRST = 50
"""Steps of the shorter run; the longer one trains FIRST + --steps."""


def run_steps(variant: str, steps: int, data_steps: int, workdir: str) -> None:
    """In this process: builds `variant` and trains exactly `steps` steps in one epoch on the
    data of `data_steps` steps (the same tensors in every run); raises if another count ran."""
    sys.path.insert(0, str(HERE))
    import torch

    torch.set_num_threads(1)
    import workload

    # One epoch of `steps` steps; every variant reads these when it builds.
    workload.EPOCHS, workload.STEPS_PER_EPOCH, workload.TOTAL_STEPS = 1, steps, steps
    workload.N_SAMPLES = data_steps * workload.BATCH
    make_loader = workload.make_loader
    workload.make_loader = lambda x, y: make_loader(x[:steps * workload.BATCH],
                                                    y[:steps * workload.BATCH])
    module = workload.load_variant(variant)
    x, y = workload.make_data()
    train, _ = module.build(x, y, workdir)
    torch.set_num_threads(1)
    gc.collect()
    train()
    if workload.STAMPS.n != steps:
        raise RuntimeError(f"{variant} ran {workload.STAMPS.n} forwards (got steps={steps}); "
                           "the step count did not reach the variant.")


def total_ir(callgrind_out: Path) -> int:
    """The whole program's instruction count: the "totals:" (else "summary:") line."""
    text = callgrind_out.read_text()
    for key in ("totals", "summary"):
        found = re.search(rf"^{key}:\s+(\d+)", text, re.MULTILINE)
        if found:
            return int(found.group(1))
    raise RuntimeError(f"{callgrind_out} has no totals: or summary: line.")


def counted(variant: str, steps: int, data_steps: int, scratch: Path) -> int:
    """Ir of a fresh process under callgrind that trains `steps` steps of `variant`."""
    out = scratch / f"{variant}.{steps}.callgrind"
    workdir = tempfile.mkdtemp(dir=scratch, prefix="w")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0",
               # Neither run writes bytecode caches, so both read or both compile the same.
               PYTHONDONTWRITEBYTECODE="1")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=yes",
           f"--callgrind-out-file={out}", sys.executable, str(Path(__file__).resolve()),
           "--child", variant, str(steps), str(data_steps), workdir]
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} at {steps} steps failed (exit {done.returncode}):\n"
                           + done.stdout[-4000:])
    return total_ir(out)


def cadence_source() -> dict[str, str | None]:
    """Which cadence the children import, and its checkout's commit where it is one."""
    spec = importlib.util.find_spec("cadence")
    if spec is None or spec.origin is None:
        raise RuntimeError("`import cadence` finds nothing; install it or set PYTHONPATH.")
    root = Path(spec.origin).resolve().parent.parent
    rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "cadence"],
                           capture_output=True, text=True)
    return {"path": str(root), "commit": rev.stdout.strip() or None,
            "uncommitted_changes": bool(dirty.stdout.strip()) if rev.returncode == 0 else None}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        variant, steps, data_steps, workdir = sys.argv[2:6]
        run_steps(variant, int(steps), int(data_steps), workdir)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated names from benchmarks/variants/")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    names = [name for name in args.variants.split(",") if name]
    unknown = [n for n in names if not (HERE / "variants" / f"{n}.py").is_file()]
    if unknown or args.steps < 1:
        parser.error(f"unknown variants {unknown} or --steps (got {args.steps}) below 1")
    source = cadence_source()
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True)
    result = {
        "method": (f"valgrind --tool=callgrind --instr-atstart=yes, whole process; "
                   f"(Ir({FIRST + args.steps} steps) - Ir({FIRST} steps)) / {args.steps}, "
                   "one epoch each, same data, fresh process per count"),
        "first_steps": FIRST, "steps": args.steps, "cadence": source,
        "python": platform.python_version(), "valgrind": valgrind.stdout.strip(),
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="instr-") as tmp:
        for name in names:
            start = time.perf_counter()
            low = counted(name, FIRST, FIRST + args.steps, Path(tmp))
            high = counted(name, FIRST + args.steps, FIRST + args.steps, Path(tmp))
            result["variants"][name] = {"ir_first": low, "ir_last": high,
                                        "instructions_per_step": (high - low) / args.steps,
                                        "seconds": round(time.perf_counter() - start, 1)}
            print(f"{name:<22} {(high - low) / args.steps:>12,.0f} instructions/step", flush=True)
    raw = result["variants"].get("raw_loop")
    for record in result["variants"].values():
        if raw:
            record["ratio_to_raw_loop"] = round(
                record["instructions_per_step"] / raw["instructions_per_step"], 4)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
