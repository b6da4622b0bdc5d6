"""The benchmark suite: one command, figures as ratios to the raw loop measured in the same run.

    python benchmarks/run.py                    # writes docs/benchmarks.md (~15 min on 2 cores)
    python benchmarks/run.py --smoke            # seconds: keeps the suite working (CI runs it)

Workloads (every measurement in a fresh process; rounds interleaved, the order rotated each
round, one untimed warm-up round; ``--smoke`` without a GPU forks each child from this process,
torch and cadence imported once):

1. Overhead-bound MLP (the peers' workload): the raw loop, each cadence front-end with its
   defaults on, and -- when the peers' harness and its virtual environment are present
   (``../shared/bench/peers``, ``$HOME/.cache/cadence-bench/venv``) -- each peer.
2. Compute-bound: the char transformer on CPU, a raw loop vs the Task `Trainer`.
3. Input-bound: loading a batch takes as long as computing on it; no prefetch, cadence's
   threaded `DataFlow`, and the same inside a `TrainLoop`.
4. Checkpoint stall for ~1.2 GB of state: cadence synchronous and asynchronous saves, a bare
   ``torch.save``, and the host-copy floor.
5. Start-up: ``import cadence`` and the Trainer stack on top of ``import torch``, and
   ``cadence --help``.
6. GPU (``benchmarks/gpu.py``): the launch-bound MLP per front-end, the char transformer eager
   and compiled, the checkpoint stall of state on the GPU, and host syncs per front-end; every
   variant of a comparison on the same CUDA device. Skipped, with a line in the report, where
   no GPU is found; ``--smoke`` without one runs a few of its variants on the CPU, tiny.
7. GPT (``benchmarks/gpt.py``): the GPT-2-style ``gpt`` model, a hand-written nanoGPT-style
   loop doing the Trainer's work against the Task Trainer, eager and compiled, fp32 and bf16
   autocast: tokens/s, recompiles after the first loop, host reads per step; on a GPU at GPT-2
   small's size (124M) with MFU and peak memory, else at a test size on the CPU.
8. Token loader (``benchmarks/token_loader.py``): `TokenLoader`'s tokens/s from memory-mapped
   token shards on one core, plain windows, packed, a mixture of three; and the input wait of a
   ``gpt`` run as its timeline records it.

Benchmarks are not tests: they print figures and write them down; ``--smoke`` only proves that
every variant still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OURS = ["raw_loop", "cadence_controller", "cadence_controller_50_callbacks", "cadence_trainer",
        "cadence_trainer_accuracy", "cadence_train_loop", "cadence_tensorpack"]
PEERS = ["raw_dl", "lightning_lean", "lightning_defaults", "fabric", "ignite",
         "accelerate_loop", "tnt_autounit", "tnt_trainunit", "keras_dl"]
CHECKPOINT_KINDS = ["floor", "async", "torch_save", "sync"]
GPU_SMOKE_ON_CPU = [("mlp", "raw"), ("mlp", "cadence_trainer"), ("lm", "raw"),
                    ("lm", "cadence_trainer"), ("ckpt", "async"), ("syncs", "cadence_trainer")]
"""What ``--smoke`` runs of workload 6 where there is no GPU: enough to keep gpu.py working."""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", KERAS_BACKEND="torch",
               PYTHONDONTWRITEBYTECODE="1", TF_CPP_MIN_LOG_LEVEL="3")
    env.update(extra or {})
    return env


FORK_CHILDREN = False
"""Whether `run_json` forks this process for a child script instead of starting a Python:
``--smoke`` without a GPU (`preimport`), where the figures are meaningless and each of the ~30
children would spend 2-3 s importing torch, Dynamo and cadence before a second of work."""


def preimport() -> None:
    """Imports what the child scripts import, once, for `FORK_CHILDREN`: forked, each child
    starts with them imported. Nothing here starts a thread (torch's intra-op pool starts at
    its first parallel operation), and no CUDA is initialized (a forked child could not use
    it): only for runs without a GPU."""
    global FORK_CHILDREN

    import torch
    import torch._dynamo  # the optimizers' first step imports it
    import torch.nn.functional
    import torch.utils.data

    import cadence
    import cadence.engine.debug
    import cadence.task.experiments.char_lm
    import cadence.task.experiments.gpt
    import cadence.task.train_lib

    for name in ("Trainer", "TrainLoop", "SimpleTrainer", "Controller", "load_config"):
        getattr(cadence, name)
    assert not torch.cuda.is_initialized()
    FORK_CHILDREN = True


def fork_children_if_smoke(smoke: bool) -> bool:
    """Whether the children of a ``--smoke`` run are forked from this process (no GPU here):
    then imports their modules once (`preimport`)."""
    if smoke:
        import torch

        if not torch.cuda.is_available():
            preimport()
    return FORK_CHILDREN


def run_forked(command: list[str], env: dict[str, str], log: TextIO) -> int:
    """``python script.py ARGS`` (`command`) run as a fork of this process, with `env` as its
    environment and its output to `log`; its exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: run the script as __main__, then leave without unwinding
        import atexit
        import runpy
        import traceback

        code = 1
        atexit._clear()  # this process's (a TemporaryDirectory's cleanup...): not the child's
        try:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.environ.clear()
            os.environ.update(env)
            import torch

            torch.set_num_threads(int(env.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
            sys.argv = command[1:]
            sys.path[0] = str(Path(command[1]).resolve().parent)
            try:
                runpy.run_path(command[1], run_name="__main__")
                code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
            atexit._run_exitfuncs()
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def run_json(command: list[str], out: Path, env: dict[str, str], log: Path,
             timeout: float | None = None) -> dict | None:
    """Runs a child script that writes one JSON record to `out` (forked with `FORK_CHILDREN`,
    else a fresh process, stopped after `timeout` seconds), its output appended to `log`; the
    record, or None -- with a line saying so -- when the child failed."""
    if out.exists():
        out.unlink()
    with open(log, "a") as f:
        f.write(f"\n===== {' '.join(command)}{' (forked)' if FORK_CHILDREN else ''}\n")
        f.flush()
        if FORK_CHILDREN and command[0] == sys.executable:
            returncode = run_forked(command, env, f)
        else:
            returncode = subprocess.run(command, env=env, stdout=f, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, check=False,
                                        timeout=timeout).returncode
    if returncode != 0 or not out.exists():
        print(f"  FAILED ({returncode}): {' '.join(command)} -- see {log}", flush=True)
        return None
    return json.loads(out.read_text())


def rounds(names: list[str], reps: int, warmup: int):
    """(round, name) in interleaved order; negative rounds are warm-ups."""
    for r in range(-warmup, reps):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            yield r, name


def bench_overhead(args: argparse.Namespace, tmp: Path, log: Path) -> dict:
    peers_python = Path(args.peers_python) if args.peers_python else None
    harness = Path(args.harness)
    use_peers = (not args.smoke and peers_python is not None and peers_python.exists()
                 and (harness / "step_bench.py").exists())
    names = OURS + (PEERS if use_peers else [])
    env = child_env({"CADENCE_BENCH_SAMPLES": "3200"} if args.smoke else None)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for r, name in rounds(names, 1 if args.smoke else args.reps, 0 if args.smoke else 1):
        out = tmp / f"{name}.json"
        workdir = Path(tempfile.mkdtemp(dir=tmp))
        if name in OURS:
            command = [sys.executable, str(HERE / "step.py"), name, "--out", str(out),
                       "--workdir", str(workdir)]
        else:
            command = [str(peers_python), str(harness / "step_bench.py"), name, "--out",
                       str(out)]
        record = run_json(command, out, env, log)
        if record is not None and r >= 0:
            results[name].append(record)
            print(f"  round {r} {name}: {record['us_per_step']:.0f} us/step", flush=True)
    return {"peers": use_peers, "results": results}


def bench_script(script: str, kinds: list[str], extra: list[str], args: argparse.Namespace,
                 tmp: Path, log: Path, workdir: bool = False) -> dict:
    results: dict[str, list[dict]] = {kind: [] for kind in kinds}
    reps = 1 if args.smoke else max(1, args.reps - 2)
    for r, kind in rounds(kinds, reps, 0):
        out = tmp / f"{script}-{kind}.json"
        command = [sys.executable, str(HERE / script), kind, *extra, "--out", str(out)]
        if workdir:
            command += ["--workdir", tempfile.mkdtemp(dir=tmp)]
        record = run_json(command, out, child_env(), log)
        if record is not None:
            results[kind].append(record)
            print(f"  round {r} {script} {kind}: {record}", flush=True)
    return results


def bench_checkpoints(args: argparse.Namespace, tmp: Path, log: Path) -> dict:
    mb = 8 if args.smoke else args.ckpt_mb
    results: dict[str, list[dict]] = {kind: [] for kind in CHECKPOINT_KINDS}
    for r, kind in rounds(CHECKPOINT_KINDS, max(1, args.reps - 2) if not args.smoke else 1, 0):
        out = tmp / f"ckpt-{kind}.json"
        workdir = Path(tempfile.mkdtemp(dir=tmp))
        record = run_json([sys.executable, str(HERE / "checkpoint_stall.py"), kind, "--mb",
                           str(mb), "--out", str(out), "--workdir", str(workdir)],
                          out, child_env(), log)
        if record is not None:
            results[kind].append(record)
            print(f"  round {r} checkpoint {kind}: stall {record['stall_s']:.3f}s", flush=True)
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
    return results


def bench_gpu(args: argparse.Namespace, tmp: Path, log: Path) -> dict:
    """Workload 6: {"device": ..., "skipped": reason} or results by workload and variant."""
    import torch

    sys.path.insert(0, str(HERE))
    import gpu

    if torch.cuda.is_available():
        device, tiny = "cuda", args.smoke
        plan = [(w, v) for w, vs in (("mlp", gpu.MLP_VARIANTS), ("lm", gpu.LM_VARIANTS))
                for v in vs]
        if args.smoke:
            plan = [(w, v) for w, v in plan if not v.endswith("_compiled")]
    elif args.smoke:
        device, tiny, plan = "cpu", True, list(GPU_SMOKE_ON_CPU)
    else:
        return {"skipped": "no CUDA device here (torch.cuda.is_available() is False)"}
    results: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                     "tiny": tiny, "mlp": {}, "lm": {}, "ckpt": {}, "syncs": {}}
    timed = [(w, v) for w, v in plan if w in ("mlp", "lm")]
    once = [(w, v) for w, v in plan if w not in ("mlp", "lm")]
    if device == "cuda":
        once = [("ckpt", kind) for kind in gpu.CKPT_KINDS[: 2 if args.smoke else None]]
        once += [("syncs", v) for v in gpu.SYNC_VARIANTS[: 1 if args.smoke else None]]
    reps = 1 if args.smoke else args.reps
    for workload in ("mlp", "lm"):
        names = [v for w, v in timed if w == workload]
        for r, variant in rounds(names, reps, 0 if args.smoke else 1):
            record = _gpu_child(workload, variant, device, tiny, tmp, log)
            if record is not None and r >= 0:
                results[workload].setdefault(variant, []).append(record)
                print(f"  round {r} {workload} {variant}: {record['us_per_step']:.0f} us/step",
                      flush=True)
    for workload, variant in once:
        record = _gpu_child(workload, variant, device, tiny, tmp, log)
        if record is not None:
            results[workload][variant] = record
            print(f"  {workload} {variant}: {json.dumps(record)[:300]}", flush=True)
    return results


def _gpu_child(workload: str, variant: str, device: str, tiny: bool, tmp: Path,
               log: Path) -> dict | None:
    out = tmp / f"gpu-{workload}-{variant}.json"
    workdir = Path(tempfile.mkdtemp(dir=tmp))
    command = [sys.executable, str(HERE / "gpu.py"), workload, variant, "--out", str(out),
               "--workdir", str(workdir), "--device", device, *(["--tiny"] if tiny else [])]
    record = run_json(command, out, child_env({"OMP_NUM_THREADS": "1"} if device == "cpu"
                                              else {"OMP_NUM_THREADS": "4"}), log)
    subprocess.run(["rm", "-rf", str(workdir)], check=False)
    return record


MALLOC_FIXED = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
"""glibc's mmap and trim thresholds, fixed (setting them turns off their dynamic adjustment)."""

GPT_VARIANTS = [(kind, precision, compiled) for precision in ("fp32", "bf16")
                for compiled in (False, True) for kind in ("raw", "trainer")]


def gpt_name(kind: str, precision: str, compiled: bool) -> str:
    return f"{kind} {precision} {'compiled' if compiled else 'eager'}"


def bench_gpt(args: argparse.Namespace, tmp: Path, log: Path) -> dict:
    """Workload 7: records by variant name, and host reads per step by kind."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = "124m" if device == "cuda" else "test"
    steps = ["--steps", "20"] if args.smoke else []
    variants = [v for v in GPT_VARIANTS if not (args.smoke and v[2])]
    names = {gpt_name(*variant): variant for variant in variants}
    results: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                     "size": size, "runs": {name: [] for name in names}, "syncs": {}}
    # On the CPU, glibc's malloc moves its mmap threshold with the allocation history, so two
    # processes doing the same steps can differ by 4% in backward alone; fixed, the comparison
    # measures the loops, not what each allocated before them (docs/performance.md).
    env = child_env({"OMP_NUM_THREADS": "1", **MALLOC_FIXED} if device == "cpu"
                    else {"OMP_NUM_THREADS": "4"})
    reps = 1 if args.smoke else args.reps  # the differences are small: five rounds, not three
    for r, name in rounds(list(names), reps, 0):
        kind, precision, compiled = names[name]
        out = tmp / "gpt.json"
        command = [sys.executable, str(HERE / "gpt.py"), kind, "--precision", precision,
                   "--size", size, "--device", device, "--out", str(out),
                   "--workdir", tempfile.mkdtemp(dir=tmp), *steps,
                   *(["--compile"] if compiled else [])]
        record = run_json(command, out, env, log)
        if record is not None:
            results["runs"][name].append(record)
            print(f"  round {r} gpt {name}: {record['steady_tokens_per_s']:.0f} tokens/s "
                  f"steady", flush=True)
    for kind in ("raw", "trainer"):  # eager fp32, counting host reads (slower: not timed)
        out = tmp / "gpt-syncs.json"
        record = run_json([sys.executable, str(HERE / "gpt.py"), kind, "--count-syncs",
                           "--size", size, "--device", device, "--steps", "30", "--out",
                           str(out), "--workdir", tempfile.mkdtemp(dir=tmp)], out, env, log)
        if record is not None:
            results["syncs"][kind] = record["syncs_per_step"]
    return results


def bench_loader(args: argparse.Namespace, tmp: Path, log: Path) -> dict:
    """Workload 8: the token loader's figures (``benchmarks/token_loader.py``)."""
    out = tmp / "loader.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "token_loader.py"), "--json", str(out),
               *(["--smoke"] if args.smoke else [])]
    with open(log, "a") as handle:
        subprocess.run(command, check=True, env=child_env(), stdout=handle,
                       stderr=subprocess.STDOUT)
    return json.loads(out.read_text())


def loader_report(results: dict) -> list[str]:
    """Section 8 of the report."""
    from token_loader import table

    return ["", "## 8. Token loader", "",
            "`cadence.TokenLoader` alone, one core (one torch and one NumPy thread): data shard "
            "0's batches of a global batch of 8 shards x 16 sequences of 1,024 tokens, from "
            f"memory-mapped uint16 token shards of {results['tokens'] / 1e6:.0f} M random "
            "tokens with a document index (documents of ~1,000 tokens), in the page cache. "
            "`packed`: position ids and masked boundaries made for every window. `mixture`: "
            "three sources, 60/20/20. The last column compares with ~0.5 M tokens/s, the rate "
            "a GPU's training step of a 124M model (GPT-2 small) is taken to consume on an "
            "H100: one core of loading keeps many such GPUs fed.", "", *table(results)]


def gpt_report(results: dict) -> list[str]:
    """Section 7 of the report."""
    on_gpu = results["device"] != "cpu"
    lines = ["", f"## 7. GPT: the `gpt` model ({results['size']}) on {results['device']}", "",
             "cadence's GPT-2-style decoder (tied embedding and head, pre-LayerNorm blocks, "
             "`scaled_dot_product_attention`). `raw`: a hand-written nanoGPT-style loop doing "
             "the Trainer's work -- the same model, data order, AdamW, clipping, "
             "warmup-cosine schedule, and loss, gradient-norm and accuracy accumulated on the "
             "device, read once per loop. `trainer`: `run_experiment(gpt, mode=train)` as "
             "`cadence train` runs it (summaries, run directory; no checkpoints, no "
             "evaluation). Compiled: the same region in both (forward, loss, metrics; "
             "`trainer.compile_step`). `steady`: from the end of the first loop to the end of "
             "the last. Ratio: the Trainer's steady tokens/s over the raw loop's of the same "
             "precision and compilation (target >= 0.99). `recompiles`: Dynamo graphs compiled "
             "after the first loop (target 0)." + (
                 " On the CPU both run with glibc's mmap threshold fixed (`MALLOC_MMAP_"
                 "THRESHOLD_`): left dynamic, it depends on what a process allocated before the "
                 "loop, and backward alone differed by up to 4% between two processes doing the "
                 "same steps." if not on_gpu else ""), "",
             "| variant | tokens/s median [min-max] | steady tokens/s | steady ratio | "
             "recompiles |" + (" peak MB | MFU |" if on_gpu else ""),
             "|---|---|---|---|---|" + ("---|---|" if on_gpu else "")]
    runs = results["runs"]
    for name, records in runs.items():
        if not records:
            lines.append(f"| {name} | failed | | | |")
            continue
        steady = [r["steady_tokens_per_s"] for r in records]
        base = [b["steady_tokens_per_s"] for b in runs.get(name.replace("trainer", "raw"), [])]
        ratio = (f"{statistics.median(steady) / statistics.median(base):.3f}x"
                 if base and name.startswith("trainer") else "1.000x" if base else "n/a")
        row = (f"| {name} | {spread([r['tokens_per_s'] for r in records])} | "
               f"{spread(steady)} | {ratio} | "
               f"{max(r['recompiles'] for r in records) if 'compiled' in name else ''} |")
        if on_gpu:
            row += (f" {statistics.median(r['peak_mem_mb'] for r in records):.0f} | "
                    f"{statistics.median(r['mfu'] for r in records):.1%} |")
        lines.append(row)
    syncs = results.get("syncs", {})
    if syncs.get("raw") and syncs.get("trainer"):
        between = {kind: statistics.median(syncs[kind]) for kind in ("raw", "trainer")}
        at_log = {kind: max(syncs[kind]) - between[kind] for kind in ("raw", "trainer")}
        lines += ["", "Host reads of tensor values (`cadence.debug.count_host_syncs`: `item`, "
                  "`tolist`, `float`, ...; on a GPU CUDA's own reports too) per step after the "
                  f"first loop, eager fp32: between log points raw {between['raw']:.0f}, Trainer "
                  f"{between['trainer']:.0f} a step -- the Trainer's extra: "
                  f"{between['trainer'] - between['raw']:.0f} (target 0); at a log point "
                  f"{at_log['raw']:.0f} and {at_log['trainer']:.0f} more." + (
                      " On the CPU AdamW's per-parameter step counters are read too (host "
                      "tensors: they never wait for a GPU), in both loops alike." if not on_gpu
                      else "")]
    return lines


def bench_startup(args: argparse.Namespace) -> dict:
    cases = {
        "python": "pass",
        "import torch": "import torch",
        "import torch, cadence": "import torch, cadence",
        "import torch + cadence front-ends": (
            "import torch, cadence; cadence.Trainer; cadence.TrainLoop; cadence.SimpleTrainer; "
            "cadence.Controller; cadence.load_config"),
    }
    reps = 1 if args.smoke else 5
    results: dict[str, list[float]] = {name: [] for name in [*cases, "cadence --help"]}
    for _ in range(reps):
        for name, code in cases.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, env=child_env())
            results[name].append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "cadence", "--help"], check=True,
                       stdout=subprocess.DEVNULL, env=child_env())
        results["cadence --help"].append(time.perf_counter() - start)
    return results


# ---------------------------------------------------------------------------- report


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    if not values:
        return "n/a"
    return (f"{fmt.format(statistics.median(values))} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]")


def environment(args: argparse.Namespace) -> dict:
    import torch

    import cadence

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "torch": torch.__version__,
            "cadence": cadence.__version__, "cuda": torch.cuda.is_available(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.peers_python and Path(args.peers_python).exists() and not args.smoke:
        freeze = subprocess.run([str(Path(args.peers_python).parent / "pip"), "freeze"],
                                capture_output=True, text=True, check=False).stdout
        wanted = ("lightning", "pytorch-ignite", "accelerate", "torchtnt", "keras")
        info["peers"] = ", ".join(line for line in freeze.splitlines()
                                  if line.split("==")[0].lower() in wanted)
    return info


def gpu_report(results: dict) -> list[str]:
    """Section 6 of the report."""
    if "skipped" in results:
        return ["", "## 6. GPU", "", f"Skipped: {results['skipped']}. Run the suite where a "
                "GPU is found (`python benchmarks/run.py --only gpu`)."]
    on_cpu = results["device"] == "cpu"
    lines = ["", f"## 6. GPU: {results['device']}", ""]
    if on_cpu:
        lines += ["**No GPU here: a few variants ran on the CPU with tiny sizes, only to keep "
                  "`benchmarks/gpu.py` working. Figures meaningless.**", ""]
    lines += ["Every variant on the same device; ratios to the raw loop of the same run "
              "(compiled variants to the raw compiled loop); `steady` leaves out the first "
              "quarter (mlp: the first epoch) and the end. `recompiles`: Dynamo compilations "
              "after the first quarter (target 0).", ""]
    for workload in ("mlp", "lm"):
        records = results.get(workload, {})
        if not records:
            continue
        lines += [f"### {workload}", "", "| variant | us/step median [min-max] | ratio | "
                  "steady us/step | steady ratio | recompiles | peak MB |",
                  "|---|---|---|---|---|---|---|"]
        for variant, runs in records.items():
            base = records.get("raw_compiled" if "_compiled" in variant else "raw", [])
            us = [r["us_per_step"] for r in runs]
            steady = [r["steady_us_per_step"] for r in runs if "steady_us_per_step" in r]
            base_us = [r["us_per_step"] for r in base]
            base_steady = [r["steady_us_per_step"] for r in base if "steady_us_per_step" in r]
            ratio = (f"{statistics.median(base_us) / statistics.median(us):.3f}x"
                     if base_us else "n/a")
            steady_ratio = (f"{statistics.median(base_steady) / statistics.median(steady):.3f}x"
                            if base_steady and steady else "n/a")
            recompiles = max((r.get("recompiles", 0) for r in runs), default=0)
            peak = statistics.median(r.get("peak_mem_mb", 0.0) for r in runs)
            lines.append(f"| {variant} | {spread(us)} | {ratio} | {spread(steady)} | "
                         f"{steady_ratio} | {recompiles if '_compiled' in variant else ''} | "
                         f"{peak:.0f} |")
        lines.append("")
    if results.get("ckpt"):
        lines += ["### checkpoint stall", "", "| kind | state MB | stalls s | completes s |",
                  "|---|---|---|---|"]
        for kind, r in results["ckpt"].items():
            lines.append(f"| {kind} | {r['state_mb']:.0f} | "
                         f"{[round(x, 3) for x in r['stalls']]} | "
                         f"{[round(x, 3) for x in r['completes']]} |")
        lines.append("")
    if results.get("syncs"):
        lines += ["### host syncs (whole run: log points included)", ""]
        for variant, r in results["syncs"].items():
            lines.append(f"- {variant}: {r['count']} over {r['steps']} steps: "
                         f"{json.dumps(r['where'])[:600]}")
    return lines


def report(env: dict, overhead: dict, compute: dict, inputs: dict, checkpoints: dict,
           startup: dict, smoke: bool, gpu: dict | None = None,
           gpt: dict | None = None, loader: dict | None = None,
           kept: list[str] | None = None) -> str:
    lines = ["# Benchmarks", "",
             "Written by `python benchmarks/run.py` (the one command; `--smoke` for a quick "
             "check). The figures of a section are from one run: fresh processes, variants "
             "interleaved with the order rotated each round, medians with [min-max]. Ratios "
             "compare with the raw loop **measured in the same run**; this machine drifts "
             "20-30% from minute to minute, so compare only within a table.", "",
             f"Machine: {env['cpu']}, {env['cores']} cores; {env['platform']}; Python "
             f"{env['python']}; torch {env['torch']}; cadence {env['cadence']}; CUDA: "
             f"{env['cuda']}. Written {env['date']}; each section says when it was measured."
             + (" **Smoke run: figures meaningless.**" if smoke else ""), ""]
    if env.get("peers"):
        lines += [f"Peers: {env['peers']}.", ""]
    results = overhead["results"]
    base = [r["us_per_step"] for r in results.get("raw_loop", [])]
    base_median = statistics.median(base) if base else float("nan")
    lines += ["## 1. Overhead-bound MLP", "",
              "MLP 64-128-128-10, SGD 0.01, batch 32, 1,000 steps/epoch x 3 epochs, one "
              "thread; only the training call is timed (building the trainer is `build s`). "
              "`ratio` = raw loop's median us/step / the variant's (higher is faster; 1.00 = "
              "the raw loop). cadence front-ends run with their defaults on; see each "
              "description.", "",
              "| variant | us/step median [min-max] | ratio to raw | steady us/step | build s | "
              "final loss | what |", "|---|---|---|---|---|---|---|"]
    for name, records in results.items():
        if not records:
            lines.append(f"| {name} | failed | | | | | |")
            continue
        us = [r["us_per_step"] for r in records]
        steady = [r["steady_us_per_step"] for r in records if "steady_us_per_step" in r]
        ratio = base_median / statistics.median(us)
        lines.append(
            f"| {name} | {spread(us)} | {ratio:.2f}x | {spread(steady)} | "
            f"{statistics.median(r['build_s'] for r in records):.2f} | "
            f"{records[-1]['final_loss']:.6f} | {records[-1].get('description', '')} |")
    if not overhead["peers"]:
        lines += ["", "Peers not measured in this run (their harness or virtual environment "
                  "was not found, or `--smoke`)."]
    if compute.get("raw") and compute.get("trainer"):
        raw = [r["ms_per_step"] for r in compute["raw"]]
        ours = [r["ms_per_step"] for r in compute["trainer"]]
        raw_steady = [r["steady_ms_per_step"] for r in compute["raw"] if "steady_ms_per_step" in r]
        ours_steady = [r["steady_ms_per_step"] for r in compute["trainer"]
                       if "steady_ms_per_step" in r]
        lines += ["", "## 2. Compute-bound: char transformer on CPU", "",
                  "d_model 128, 2 layers, sequence 128, batch 32, AdamW, gradient clipping, "
                  "one thread, 40 steps per run. Both compute the loss, accuracy and gradient "
                  "norm on the device and read them once per loop of 10; the Trainer adds its "
                  "summaries per loop and an async checkpoint every 20.",
                  "`ms/step` is the whole run, including the final checkpoint's write that "
                  "`controller.train` waits for; `steady` runs from the forward of the step "
                  "after the first quarter to the forward of the last step: no one-time start "
                  "costs, no end of training (the checkpoint at step 20 is inside it).",
                  "", "| variant | ms/step median [min-max] | ratio to raw | steady ms/step | "
                  "steady ratio |", "|---|---|---|---|---|",
                  f"| raw loop | {spread(raw, '{:.1f}')} | 1.00x | "
                  f"{spread(raw_steady, '{:.1f}')} | 1.00x |",
                  f"| Task Trainer + Controller | {spread(ours, '{:.1f}')} | "
                  f"{statistics.median(raw) / statistics.median(ours):.2f}x | "
                  f"{spread(ours_steady, '{:.1f}')} | "
                  + (f"{statistics.median(raw_steady) / statistics.median(ours_steady):.2f}x |"
                     if raw_steady and ours_steady else "n/a |")]
    if any(inputs.values()):
        lines += ["", "## 3. Input-bound", "",
                  "Loading a batch (a sleep standing for decoding or a read) takes as long as "
                  "computing on it. `ratio` = epoch time / (batches x max(load, compute)): 2.0 "
                  "is a serial pipeline, 1.0 perfect overlap.", "",
                  "| pipeline | load ms | compute ms | epoch s median [min-max] | ratio |",
                  "|---|---|---|---|---|"]
        names = {"serial": "no prefetch", "prefetch": "DataFlow.threaded(4)",
                 "train_loop": "DataFlow.threaded(4) in a TrainLoop"}
        for kind, records in inputs.items():
            if records:
                lines.append(
                    f"| {names[kind]} | {records[0]['load_ms']:.1f} | "
                    f"{records[0]['compute_ms']:.1f} | "
                    f"{spread([r['epoch_s'] for r in records], '{:.3f}')} | "
                    f"{statistics.median(r['ratio'] for r in records):.2f} |")
    lines += ["", "## 4. Checkpoint stall", "",
              "Time the training loop waits to checkpoint model + Adam state (`state MB`); "
              "`complete s` is when the checkpoint is committed. `lost s`: the stall plus what "
              "training steps run during the background write lost to it (its Python work "
              "holds the GIL); a synchronous save loses its stall.", "",
              "| kind | state MB | stall s median [min-max] | complete s | lost s | "
              "stall vs floor | stall vs torch.save |", "|---|---|---|---|---|---|---|"]
    floor = statistics.median(r["stall_s"] for r in checkpoints["floor"]) \
        if checkpoints["floor"] else float("nan")
    torch_save = statistics.median(r["stall_s"] for r in checkpoints["torch_save"]) \
        if checkpoints["torch_save"] else float("nan")
    names = {"floor": "copy into preallocated host buffers (floor)",
             "async": "cadence async save", "torch_save": "bare torch.save (no fsync)",
             "sync": "cadence sync save (torch.save, fsync, atomic commit)"}
    for kind, records in checkpoints.items():
        if not records:
            continue
        stall = [r["stall_s"] for r in records]
        complete = [r["complete_s"] for r in records if "complete_s" in r]
        lost = [r.get("lost_s", r["stall_s"]) for r in records] if kind in ("async", "sync") \
            else []
        median = statistics.median(stall)
        lines.append(f"| {names[kind]} | {records[0]['state_mb']:.0f} | "
                     f"{spread(stall, '{:.3f}')} | {spread(complete, '{:.3f}')} | "
                     f"{spread(lost, '{:.3f}')} | "
                     f"{median / floor:.2f}x | {median / torch_save:.0%} |")
    lines += ["", "## 5. Start-up", "", "| command | wall s median [min-max] | on top of "
              "`import torch` |", "|---|---|---|"]
    torch_median = statistics.median(startup["import torch"])
    for name, values in startup.items():
        extra = (f"+{(statistics.median(values) - torch_median) * 1000:.0f} ms"
                 if name.startswith("import torch") and name != "import torch" else "")
        lines.append(f"| `{name}` | {spread(values, '{:.3f}')} | {extra} |")
    if gpu is not None:
        lines += gpu_report(gpu)
    if gpt is not None:
        lines += gpt_report(gpt)
    if loader is not None:
        lines += loader_report(loader)
    if kept:
        lines += ["", *kept]
    lines += ["", "Where the time goes and what is not yet met: `docs/performance.md`."]
    return "\n".join(lines) + "\n"


SECTIONS = {"1": "overhead", "2": "compute", "3": "input", "4": "checkpoint", "5": "startup",
            "6": "gpu", "7": "gpt", "8": "loader"}
"""The report's sections by number, and the ``--only`` name that runs each."""


def kept_sections(path: Path) -> list[str]:
    """The sections of the report at `path` that this script does not write -- a benchmark
    measured on its own, whose section says how (9: the pipeline bubble) -- line for line: a
    run writes them back as they were."""
    if not path.exists():
        return []
    kept: list[str] = []
    keeping = False
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            keeping = line[3:].split(".", 1)[0] not in SECTIONS
        elif line.startswith("Where the time goes"):
            keeping = False
        if keeping:
            kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    return kept


def date_sections(text: str, dates: dict[str, str]) -> str:
    """The report with a line under each section's heading saying when it was measured (a run
    with ``--only`` keeps the other sections from the last run)."""
    lines = []
    for line in text.splitlines():
        lines.append(line)
        if line.startswith("## "):
            key = SECTIONS.get(line[3:].split(".", 1)[0])
            if key in dates:
                lines += ["", f"Measured {dates[key]}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--ckpt-mb", type=float, default=1200)
    parser.add_argument("--harness", default=str(ROOT.parent / "shared" / "bench" / "peers"))
    parser.add_argument("--peers-python", default=os.environ.get(
        "BENCH_PYTHON", str(Path.home() / ".cache/cadence-bench/venv/bin/python")))
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--only", choices=("overhead", "compute", "input", "checkpoint",
                                           "startup", "gpu", "gpt", "loader"))
    args = parser.parse_args(argv)
    fork_children_if_smoke(args.smoke)
    tmp = Path(tempfile.mkdtemp(prefix="cadence-bench-"))
    log = tmp / "children.log"
    print(f"Benchmark scratch directory and child logs: {tmp}", flush=True)
    overhead: dict = {"peers": False, "results": {}}
    compute: dict = {"raw": [], "trainer": []}
    inputs: dict = {"serial": [], "prefetch": [], "train_loop": []}
    checkpoints: dict = {kind: [] for kind in CHECKPOINT_KINDS}
    startup: dict = {"import torch": [float("nan")]}
    gpu: dict | None = None
    gpt: dict | None = None
    loader: dict | None = None
    if args.only in (None, "overhead"):
        print("1. overhead-bound MLP", flush=True)
        overhead = bench_overhead(args, tmp, log)
    if args.only in (None, "compute"):
        print("2. compute-bound char transformer", flush=True)
        compute = bench_script("compute_bound.py", list(compute), ["--steps",
                               "4" if args.smoke else "40"], args, tmp, log, workdir=True)
    if args.only in (None, "input"):
        print("3. input-bound", flush=True)
        inputs = bench_script("input_bound.py", list(inputs), ["--batches",
                              "8" if args.smoke else "60"], args, tmp, log)
    if args.only in (None, "checkpoint"):
        print("4. checkpoint stall", flush=True)
        checkpoints = bench_checkpoints(args, tmp, log)
    if args.only in (None, "startup"):
        print("5. start-up", flush=True)
        startup = bench_startup(args)
    if args.only in (None, "gpu"):
        print("6. GPU", flush=True)
        gpu = bench_gpu(args, tmp, log)
        if "skipped" in gpu:
            print(f"  skipped: {gpu['skipped']}", flush=True)
    if args.only in (None, "gpt"):
        print("7. GPT", flush=True)
        gpt = bench_gpt(args, tmp, log)
    if args.only in (None, "loader"):
        print("8. token loader", flush=True)
        loader = bench_loader(args, tmp, log)
    saved = ROOT / "benchmarks" / "results" / "latest.json"
    env = environment(args)
    dates: dict[str, str] = {key: env["date"] for key in SECTIONS.values()
                             if args.only in (None, key)}
    if args.only and not args.smoke and saved.exists():  # the other parts: from the last run
        previous = json.loads(saved.read_text())
        dates = {**previous.get("dates", {}), **dates}
        if "peers" not in env and previous.get("peers"):
            env["peers"] = previous["peers"]
        overhead = overhead if args.only == "overhead" else previous["overhead"]
        compute = compute if args.only == "compute" else previous.get("compute", compute)
        inputs = inputs if args.only == "input" else previous.get("inputs", inputs)
        checkpoints = checkpoints if args.only == "checkpoint" else previous["checkpoints"]
        startup = startup if args.only == "startup" else previous["startup"]
        gpu = gpu if args.only == "gpu" else previous.get("gpu")
        gpt = gpt if args.only == "gpt" else previous.get("gpt")
        loader = loader if args.only == "loader" else previous.get("loader")
    if gpu is None:
        import torch

        if not torch.cuda.is_available():
            gpu = {"skipped": "no CUDA device here (torch.cuda.is_available() is False)"}
    text = date_sections(report(env, overhead, compute, inputs, checkpoints, startup,
                                args.smoke, gpu, gpt, loader, kept_sections(Path(args.out))),
                         dates)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    results = json.dumps({"overhead": overhead, "compute": compute, "inputs": inputs,
                          "checkpoints": checkpoints, "startup": startup, "gpu": gpu,
                          "gpt": gpt, "loader": loader, "dates": dates,
                          "peers": env.get("peers")}, indent=1)
    (tmp / "results.json").write_text(results)
    if not args.smoke:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(results)
    print(text)
    failed = [n for n, r in overhead["results"].items() if not r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
