"""Checkpoints at growing world sizes: save, commit and restore of FSDP2 state on N gloo ranks.

usage: python benchmarks/checkpoint_scale.py [--ranks 2 4 8 16] [--width 512] [--layers 8]
       [--out FILE.md] [--json FILE.json]

Each world size is one ``torchrun --standalone`` job on this machine. A stack of `--layers`
square linear layers (``fully_shard`` per layer, AdamW stepped once) is checkpointed twice with
``CheckpointManager(async_save=True)`` (the Task Trainer's default) -- the second save is
measured -- and restored by a fresh manager. Per rank it records:

- **stall**: the time the training thread spends in ``save`` (the copy to host memory);
- **wait**: the time in ``wait`` (every rank's write done, digests gathered, rank 0's commit);
- **rank 0's commit**: its time in ``CheckpointDirectory.commit`` (the manifest, the rename);
- **restore**: the time of ``restore``, and the **bytes it reads** -- files hashed to verify
  them, state and rank files (hashed as read), ``.metadata``, and the byte ranges of its DCP
  load plan -- against its own share of the state;
- **stats** (``os.stat``/``os.lstat`` calls) and **collectives** (calls into
  ``torch.distributed``) during the save (+ wait) and during the restore.

The table gives, per world size, the median over ranks (rank 0's for its commit), and the
fitted growth: the exponent b of ``a * N**b`` (least squares on the logs): 0 is flat, 1 linear.
On 2 shared cores, 16 ranks time-share: times grow with N for that reason alone; the counts
(bytes, stats, collectives, files) are what extrapolates.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class _Counts:
    """Counters patched into os, torch.distributed and cadence's readers for one phase."""

    def __init__(self) -> None:
        self.stats = 0
        self.collectives = 0
        self.bytes_read = 0

    def take(self) -> dict[str, int]:
        taken = {"stats": self.stats, "collectives": self.collectives,
                 "bytes_read": self.bytes_read}
        self.stats = self.collectives = self.bytes_read = 0
        return taken


def _instrument(counts: _Counts) -> None:
    import torch.distributed as dist

    import cadence.core.checkpoint_dir as checkpoint_dir
    import cadence.engine.state_file as state_file
    from cadence.engine.dcp_reading import SafeFileSystemReader

    for name in ("stat", "lstat"):
        original = getattr(os, name)

        def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            counts.stats += 1
            return _original(*args, **kwargs)

        setattr(os, name, counted)
    for name in ("all_reduce", "all_gather", "all_gather_object", "gather_object", "gather",
                 "broadcast", "broadcast_object_list", "scatter_object_list", "scatter",
                 "reduce_scatter", "barrier", "monitored_barrier", "all_gather_into_tensor",
                 "reduce_scatter_tensor"):
        original = getattr(dist, name)

        def collective(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            counts.collectives += 1
            return _original(*args, **kwargs)

        setattr(dist, name, collective)
    original_hash = checkpoint_dir.file_sha256

    def hashed(path: Any, *args: Any) -> str:
        counts.bytes_read += Path(path).stat().st_size
        return original_hash(path, *args)

    checkpoint_dir.file_sha256 = hashed
    original_read_state = state_file.read_state

    def read_state(path: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(path, (str, os.PathLike)):  # it calls itself again with the open file
            counts.bytes_read += Path(path).stat().st_size
        return original_read_state(path, *args, **kwargs)

    state_file.read_state = read_state
    import cadence.engine.checkpoint_io as checkpoint_io

    checkpoint_io.read_state = read_state  # imported by name there
    original_metadata = SafeFileSystemReader._read_metadata
    original_data = SafeFileSystemReader.read_data

    def read_metadata(self: Any, name: str) -> Any:
        counts.bytes_read += (Path(self.path) / name).stat().st_size
        return original_metadata(self, name)

    def read_data(self: Any, plan: Any, planner: Any) -> Any:
        storage = self.read_metadata().storage_data
        counts.bytes_read += sum(storage[item.storage_index].length for item in plan.items)
        return original_data(self, plan, planner)

    SafeFileSystemReader._read_metadata = read_metadata  # type: ignore[method-assign]
    SafeFileSystemReader.read_data = read_data  # type: ignore[method-assign]


def worker(width: int, layers: int, out: Path) -> None:
    """One rank of the job: train a step, save twice, restore; writes ``rank-<r>.json``."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    import cadence
    import cadence.core.checkpoint_dir as checkpoint_dir

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(4, width)).sum().backward()
        optimizer.step()
        return model, optimizer

    model, optimizer = build()
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3  # + AdamW
    directory = out / "checkpoints"
    counts = _Counts()
    _instrument(counts)
    commit_s: list[float] = []
    original_commit = checkpoint_dir.CheckpointDirectory.commit

    def commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original_commit(self, *args, **kwargs)
        finally:
            commit_s.append(time.perf_counter() - started)

    checkpoint_dir.CheckpointDirectory.commit = commit  # type: ignore[method-assign]
    manager = cadence.CheckpointManager({"model": model, "optimizer": optimizer}, directory,
                                        async_save=True, max_to_keep=2)
    manager.save(1)
    manager.wait()
    counts.take()
    commit_s.clear()
    started = time.perf_counter()
    manager.save(2)
    stall = time.perf_counter() - started
    started = time.perf_counter()
    manager.wait()
    wait = time.perf_counter() - started
    save_counts = counts.take()
    path = directory / "ckpt-2"
    files = sum(1 for p in path.rglob("*") if p.is_file())
    dist.barrier()
    fresh_model, fresh_optimizer = build()
    counts.take()
    started = time.perf_counter()
    cadence.CheckpointManager({"model": fresh_model, "optimizer": fresh_optimizer}, directory,
                              read_only=True).restore(path)
    restore = time.perf_counter() - started
    restore_counts = counts.take()
    for saved, restored in zip(model.parameters(), fresh_model.parameters()):
        assert torch.equal(saved.to_local(), restored.to_local())  # type: ignore[attr-defined]
    (out / f"rank-{rank}.json").write_text(json.dumps({
        "rank": rank, "world": world, "state_bytes": state_bytes, "stall_s": stall,
        "wait_s": wait, "commit_s": sum(commit_s), "restore_s": restore, "files": files,
        "save": save_counts, "restore": restore_counts}))
    dist.barrier()
    dist.destroy_process_group()


def run_world(world: int, width: int, layers: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix=f"cadence-scale-{world}-") as folder:
        out = Path(folder)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={world}", __file__, "--worker", "--out-dir", str(out),
                   "--width", str(width), "--layers", str(layers)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        if result.returncode != 0:
            raise SystemExit(f"{world} ranks failed:\n{result.stderr[-4000:]}")
        return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


def growth(worlds: list[int], values: list[float]) -> str:
    """The exponent b of a * N**b fitted to the values (least squares on the logs)."""
    points = [(math.log(n), math.log(v)) for n, v in zip(worlds, values) if v > 0]
    if len(points) < 2:
        return "-"
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
             / sum((x - mean_x) ** 2 for x, _ in points))
    return f"{slope:+.2f}"


def table(results: dict[int, list[dict[str, Any]]]) -> str:
    worlds = sorted(results)
    rows: list[tuple[str, list[float], str]] = []

    def median(key: Any) -> list[float]:
        return [statistics.median(key(r) for r in results[n]) for n in worlds]

    rows.append(("stall per save, ms (median rank)", median(lambda r: r["stall_s"] * 1e3),
                 "{:.1f}"))
    rows.append(("wait for the commit, ms (median rank)", median(lambda r: r["wait_s"] * 1e3),
                 "{:.1f}"))
    rows.append(("rank 0's commit, ms", [results[n][0]["commit_s"] * 1e3 for n in worlds],
                 "{:.2f}"))
    rows.append(("restore, ms (median rank)", median(lambda r: r["restore_s"] * 1e3), "{:.1f}"))
    rows.append(("state, KB (whole)", [results[n][0]["state_bytes"] / 1e3 for n in worlds],
                 "{:.0f}"))
    rows.append(("own share, KB (state / N)",
                 [results[n][0]["state_bytes"] / n / 1e3 for n in worlds], "{:.0f}"))
    rows.append(("bytes read at restore, KB (median rank)",
                 median(lambda r: r["restore"]["bytes_read"] / 1e3), "{:.0f}"))
    rows.append(("bytes read at restore, KB (most, any rank)",
                 [max(r["restore"]["bytes_read"] for r in results[n]) / 1e3 for n in worlds],
                 "{:.0f}"))
    rows.append(("files per checkpoint", [results[n][0]["files"] for n in worlds], "{:.0f}"))
    rows.append(("stats per rank, save + commit (median)", median(lambda r: r["save"]["stats"]),
                 "{:.0f}"))
    rows.append(("stats, rank 0, save + commit", [results[n][0]["save"]["stats"] for n in worlds],
                 "{:.0f}"))
    rows.append(("stats per rank, restore (median)", median(lambda r: r["restore"]["stats"]),
                 "{:.0f}"))
    rows.append(("collectives per rank, save + commit (median)",
                 median(lambda r: r["save"]["collectives"]), "{:.0f}"))
    rows.append(("collectives per rank, restore (median)",
                 median(lambda r: r["restore"]["collectives"]), "{:.0f}"))
    header = "| | " + " | ".join(f"N={n}" for n in worlds) + " | growth b (a·N^b) |"
    lines = [header, "|---" * (len(worlds) + 2) + "|"]
    for name, values, form in rows:
        lines.append(f"| {name} | " + " | ".join(form.format(v) for v in values)
                     + f" | {growth(worlds, values)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--out", help="write the table (markdown) here too")
    parser.add_argument("--json", help="write every rank's figures here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.width, args.layers, Path(args.out_dir))
        return
    results = {}
    for world in args.ranks:
        started = time.perf_counter()
        results[world] = run_world(world, args.width, args.layers)
        print(f"{world} ranks: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    text = table(results)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({str(n): r for n, r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
