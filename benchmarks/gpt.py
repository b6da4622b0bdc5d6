"""The ``gpt`` workload: cadence's GPT-2-style model, a hand-written nanoGPT-style loop against
the Task `Trainer` (through `run_experiment`, as ``cadence train`` runs it), doing the same work.

Both loops train the same model on the same data (the standard library's bytes as the
experiment's token shards, in the same order: the raw loop reads them as nanoGPT reads its
``train.bin``, through the same `TokenLoader`, as it would through any data library), with
AdamW, gradient clipping at 1, a warmup-cosine learning-rate schedule, the training loss, the
gradient norm and the next-byte accuracy accumulated on the device every step and read on the
host once per loop of ``steps_per_loop`` steps (the loop's log line). The Trainer adds what it
always does: TensorBoard and JSONL summaries per loop, the run directory, its lock and
``params.yaml``; checkpoints and evaluation are off (neither loop does them).

Variants: ``raw`` or ``trainer``; fp32 or bf16 autocast; eager or compiled (the raw loop
compiles the same region the Trainer's ``trainer.compile_step`` compiles: forward, loss and
metric updates).

usage: python benchmarks/gpt.py {raw,trainer} --out FILE.json --workdir DIR
           [--precision {fp32,bf16}] [--compile] [--size {test,124m}] [--steps N]
           [--device {cpu,cuda}] [--count-syncs]

Reported: tokens/s over the whole run and in the steady state (from the end of the first loop
to the end of the last: no compilation, no start-up, no final save), Dynamo graphs compiled
after the first loop (target 0), and with ``--count-syncs`` the host reads of device values
(``aten._local_scalar_dense``: ``item``, ``float``, ``bool`` of a tensor) per step between log
points (target 0); on a GPU also peak memory and MFU.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import time
from pathlib import Path
from typing import Any

SIZES = {
    "test": {"n_layer": 2, "n_head": 4, "n_embd": 128, "block_size": 128, "batch": 16,
             "steps": 100, "steps_per_loop": 10},
    "124m": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "batch": 16,
             "vocab_size": 50304, "steps": 300, "steps_per_loop": 50},
}


def count_syncs() -> Any:
    """cadence's own counter of host reads of tensor values (``item``, ``tolist``,
    ``__float__``, ... and, on a GPU, CUDA's own synchronization reports)."""
    from cadence.engine.debug import count_host_syncs

    return count_host_syncs(with_stack=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("raw", "trainer"))
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--size", choices=tuple(SIZES), default="test")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--count-syncs", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()

    import torch

    size = SIZES[args.size]
    steps = args.steps or size["steps"]
    per_loop = size["steps_per_loop"]
    if args.device == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(0)
    overrides = [
        f"task.model.n_layer={size['n_layer']}", f"task.model.n_head={size['n_head']}",
        f"task.model.n_embd={size['n_embd']}", f"task.model.block_size={size['block_size']}",
        f"task.model.vocab_size={size.get('vocab_size', 256)}",
        f"task.sequence_length={size['block_size']}", "task.max_bytes=2000000",
        f"task.train_data.global_batch_size={size['batch']}",
        f"trainer.train_steps={steps}", f"trainer.steps_per_loop={per_loop}",
        "trainer.checkpoint_interval=null", f"trainer.compile_step={args.compile}",
        "trainer.optimizer_config.learning_rate.warmup_steps=10",
        f"runtime.device={args.device}",
        f"runtime.mixed_precision={'bf16' if args.precision == 'bf16' else 'null'}",
    ]
    import cadence

    config = cadence.load_config("gpt", overrides=overrides)
    stamps: list[float] = []
    counting = count_syncs() if args.count_syncs else contextlib.nullcontext()
    counter = counting.__enter__()
    syncs_at_step_end: list[int] = []

    def step_ended() -> None:
        if counter is not None:
            syncs_at_step_end.append(counter.count)

    def loop_ended() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()  # the host read at the loop's end waited for it anyway
        stamps.append(time.perf_counter())

    start = time.perf_counter()
    try:
        per_step = step_ended if counter is not None else None
        if args.kind == "raw":
            model = raw_loop(config, steps, per_loop, args, loop_ended, per_step)
        else:
            model = trainer_loop(config, args, loop_ended, per_step)
    finally:
        counting.__exit__(None, None, None)
    end = time.perf_counter()

    tokens_per_step = size["batch"] * size["block_size"]
    steady = (stamps[-1] - stamps[0]) / (steps - per_loop)
    record: dict[str, Any] = {
        "kind": args.kind, "precision": args.precision, "compiled": args.compile,
        "size": args.size, "steps": steps, "tokens_per_s": tokens_per_step * steps / (end - start),
        "steady_tokens_per_s": tokens_per_step / steady, "steady_ms_per_step": steady * 1e3,
        "recompiles": recompiles_after_first_loop(),
        "parameters": model.num_parameters(),
    }
    if counter is not None:  # host reads in each step, after the first loop
        counts = syncs_at_step_end[per_loop - 1:]
        record["syncs_per_step"] = [b - a for a, b in itertools.pairwise(counts)]
    from cadence.engine.runtime import device_module, device_name
    from cadence.engine.throughput import peak_flops

    device = torch.device(args.device)
    module = device_module(device)
    if module is not None and hasattr(module, "max_memory_allocated"):
        record["peak_mem_mb"] = module.max_memory_allocated() / 2**20
    flops = model.flops_per_token(size["block_size"]) * record["steady_tokens_per_s"]
    record["device_name"] = device_name(device)
    record["tflops"] = flops / 1e12
    peak = peak_flops(record["device_name"], args.precision)  # cadence's table of peaks
    if peak is not None:
        record["mfu"] = flops / peak
    Path(args.out).write_text(json.dumps(record))


_GRAPHS_AT_FIRST_LOOP: list[int] = []


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def recompiles_after_first_loop() -> int:
    return graphs_compiled() - _GRAPHS_AT_FIRST_LOOP[0] if _GRAPHS_AT_FIRST_LOOP else 0


def raw_loop(config: Any, steps: int, per_loop: int, args: argparse.Namespace,
             loop_ended: Any, step_ended: Any = None) -> Any:
    """nanoGPT's loop, doing what the Trainer does (see the module docstring)."""
    import math
    import sys

    import torch
    from torch.nn import functional as F

    from cadence.data.token_loader import TokenLoader
    from cadence.data.token_shards import TokenShards
    from cadence.task.experiments.gpt import GPT, stdlib_token_folders

    task, optimization = config.task, config.trainer.optimizer_config
    device = torch.device(args.device)
    folders = stdlib_token_folders(task.max_bytes, task.validation_fraction)
    loader = TokenLoader([TokenShards.open(str(folders["train"]), task.sequence_length)],
                         task.train_data.global_batch_size, seed=0,
                         pin_memory=device.type == "cuda")
    model = GPT(task.model).to(device)
    opt = optimization.optimizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=opt.learning_rate,
                                  betas=tuple(opt.betas), weight_decay=opt.weight_decay)
    warmup, end_factor = optimization.learning_rate.warmup_steps, 0.1

    def multiplier(step: int) -> float:
        if step < warmup:
            return step / warmup
        t = min(step - warmup, steps - warmup)
        return end_factor + (1 - end_factor) * 0.5 * (1 + math.cos(math.pi * t / (steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
    zeros = [torch.zeros((), device=device) for _ in range(4)]
    loss_sum, norm_sum, correct, count = zeros
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16"
                else contextlib.nullcontext())

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, -2).float(), y.flatten())
        correct.add_((logits.detach().argmax(dim=-1) == y).sum())
        count.add_(y.numel())
        return loss

    step_fn = torch.compile(forward) if args.compile else forward
    for step in range(steps):
        x, y = loader.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast:
            loss = step_fn(x, y)
        loss_sum.add_(loss.detach())
        loss.backward()
        norm_sum.add_(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if (step + 1) % per_loop == 0:  # the loop's one host read, and its log line
            values = torch.stack([loss_sum / per_loop, correct / count,
                                  norm_sum / per_loop]).tolist()
            print(f"step {step + 1}: loss {values[0]:.4f} accuracy {values[1]:.4f} "
                  f"norm {values[2]:.3f} lr {schedule.get_last_lr()[0]:.2e}",
                  file=sys.stderr)
            for total in zeros:
                total.zero_()
            if step + 1 == per_loop:
                _GRAPHS_AT_FIRST_LOOP.append(graphs_compiled())
            loop_ended()
        if step_ended is not None:
            step_ended()
    return model


def trainer_loop(config: Any, args: argparse.Namespace, loop_ended: Any,
                 step_ended: Any = None) -> Any:
    """``cadence train -e gpt --mode train`` with a callback that stamps each loop's end."""

    import cadence

    class Stamp(cadence.Callback):
        def on_loop_end(self, state: cadence.RunState, logs: dict[str, Any]) -> None:
            if not _GRAPHS_AT_FIRST_LOOP:
                _GRAPHS_AT_FIRST_LOOP.append(graphs_compiled())
            loop_ended()

    class StepStamp(cadence.Callback):  # a per-step hook: only when counting
        def on_step_end(self, state: cadence.RunState) -> None:
            step_ended()

    callbacks = [Stamp(), *([StepStamp()] if step_ended is not None else [])]
    model, _ = cadence.run_experiment(config, "train", Path(args.workdir) / "run",
                                      callbacks=callbacks, progress_bar=False)
    return model


if __name__ == "__main__":
    main()
