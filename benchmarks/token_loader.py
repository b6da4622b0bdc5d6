"""The token loader alone: tokens/s of `cadence.TokenLoader` from memory-mapped token shards on
one core, with and without packing and a mixture -- against what a training step consumes --
and the input wait of a ``gpt`` run as its timeline records it.

usage: python benchmarks/token_loader.py [--smoke] [--json OUT]

Data: token files of random ids (uint16) written to a scratch folder with a document index
(documents of 1 to 2,000 tokens, ~1,000 on average), read from the page cache (as a loader reads
a corpus it has read before; a first epoch from a cold disk reads at the disk's speed). Each
batch is data shard 0's part of a global batch of 8 shards x 16 sequences of 1,024 tokens
(GPT-2 small's context): the shard draws the whole global batch's sources and reads its 16
windows. One torch and one NumPy thread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("windows", "packed", "mixture", "mixture packed")


def write_source(folder: Path, tokens: int, seed: int) -> Path:
    import numpy as np

    from cadence.data.token_format import begin_token_folder, finish_token_folder, write_shard

    generator = np.random.default_rng(seed)
    lengths = generator.integers(1, 2000, tokens // 1000 + 1)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    starts = starts[starts < tokens].astype(np.int64)
    partial = begin_token_folder(folder)
    entry = write_shard(partial, "00000",
                        generator.integers(0, 50257, tokens).astype(np.uint16), starts)
    return finish_token_folder(partial, folder, [entry], "uint16",
                               {"kind": "random", "vocab_size": 50257})


def time_variant(sources: list[Path], packed: bool, batches: int, rounds: int) -> list[float]:
    """Tokens/s of `rounds` runs of `batches` batches each (after a warm-up batch)."""
    from cadence.data.token_loader import TokenLoader
    from cadence.data.token_shards import TokenShards

    shards = [TokenShards.open(str(path), 1024, packing=packed) for path in sources]
    weights = [0.6, 0.2, 0.2][: len(shards)] if len(shards) > 1 else None
    loader = TokenLoader(shards, 128, weights=weights, shard_index=0, num_shards=8, seed=0)
    loader.next_batch()
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        rates.append(batches * loader.batch_size * 1024 / (time.perf_counter() - start))
    return rates


def gpt_data_wait(steps: int, scratch: Path) -> dict[str, float]:
    """The share of a ``gpt`` run's training loops spent waiting for input (its timeline's
    ``data_wait_s`` over the loops' seconds), the default config on this CPU."""
    run = scratch / "gpt-run"
    command = [sys.executable, "-m", "cadence", "train", "-e", "gpt", "-m", str(run), "--mode",
               "train", "--set", f"trainer.train_steps={steps}", "--set",
               f"trainer.steps_per_loop={max(1, steps // 4)}", "--set",
               f"trainer.checkpoint_interval={steps}"]
    subprocess.run(command, check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    loops = [json.loads(line) for line in (run / "timeline" / "run.jsonl").read_text().splitlines()]
    loops = [record for record in loops if record.get("event") == "loop_end"][1:]  # warm
    seconds = sum(record["seconds"] for record in loops)
    wait = sum(record["data_wait_s"] for record in loops)
    steps_timed = sum(record["steps"] for record in loops)
    return {"steps": steps_timed, "seconds": seconds, "data_wait_s": wait,
            "share": wait / seconds if seconds else float("nan")}


def table(results: dict) -> list[str]:
    """The figures as a Markdown table and a line on the ``gpt`` run's input wait."""
    lines = ["| variant | tokens/s, one core: median [min-max] | x 0.5 M tokens/s |",
             "|---|---|---|"]
    for variant, rates in results["variants"].items():
        median = statistics.median(rates)
        lines.append(f"| {variant} | {median / 1e6:.1f} M [{min(rates) / 1e6:.1f}-"
                     f"{max(rates) / 1e6:.1f}] | {median / 5e5:.0f}x |")
    gpt = results["gpt"]
    return [*lines, "", f"The `gpt` experiment on this CPU (its default config, its token shards "
            f"of the standard library), {gpt['steps']} steps after the first loop: the timeline's "
            f"input wait is {gpt['data_wait_s'] * 1000:.1f} ms of {gpt['seconds']:.1f} s "
            f"({gpt['share']:.3%})."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    tokens = 2_000_000 if args.smoke else 200_000_000
    batches, rounds = (3, 1) if args.smoke else (200, 5)
    scratch = Path(tempfile.mkdtemp(prefix="cadence-loader-"))
    sources = [write_source(scratch / f"source{n}", tokens // (1 if n == 0 else 4), n)
               for n in range(3)]
    results: dict = {"tokens": tokens, "variants": {}}
    for variant in VARIANTS:
        chosen = sources if variant.startswith("mixture") else sources[:1]
        results["variants"][variant] = time_variant(chosen, "packed" in variant, batches, rounds)
    results["gpt"] = gpt_data_wait(4 if args.smoke else 200, scratch)
    shutil.rmtree(scratch)  # hundreds of MB of tokens
    lines = table(results)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
