"""Workload 6, on one GPU: cadence against a raw loop on the same device. Runs ONE measurement
in this fresh process and writes one JSON record (`run.py` interleaves them).

usage: python benchmarks/gpu.py WORKLOAD VARIANT --out FILE.json --workdir DIR
                                [--device cuda] [--tiny]

Workloads (every variant of a workload on the same device, ``--device``):

- ``mlp``: launch-bound. MLP 64-128-128-10, SGD, batch 256, batches already on the device,
  3 epochs x 1,000 steps. What shows here is the framework's Python per step.
- ``lm``: compute-bound on a CPU, CPU-bound on an H100. cadence's char transformer (d_model 512,
  8 layers, sequence 256, batch 64), AdamW (fused on CUDA) + clipping 1.0, bf16 autocast, 120
  steps, a checkpoint every 60. ``*_compiled``: ``torch.compile`` (the raw loop compiles the
  model, the Trainer ``trainer.compile_step``); ``recompiles`` counts Dynamo compilations after
  the first quarter of the steps (target 0). Diagnostic suffixes for the Trainer:
  ``_nockpt`` (no CheckpointManager), ``_bare`` (neither checkpoints nor summaries).
- ``ckpt``: the stall of saving ~1.2 GB of model + Adam state that lives on the GPU; ``floor``
  is the copy into reused pinned host buffers.
- ``syncs``: host syncs of each front-end over 300 steps on the mlp workload
  (`cadence.debug.count_host_syncs`, with CUDA's sync debug mode), and where they happened.
- ``gpt``: GPT-2 small (the ``gpt2_small`` shape: 124M parameters, 12 layers, 1,024 tokens of
  context, batch 16) in bf16, the Task Trainer (``trainer``) against a nanoGPT-style loop
  (``raw``), eager or ``*_compiled``: steady tokens per second, TFLOPS, MFU against the device's
  peak (`cadence.engine.throughput.peak_flops`) and peak memory (``benchmarks/gpt.py`` measures
  it, in a process of its own). torchtitan's published figures for comparison are in
  ``docs/benchmarks.md``.

``--device cpu --tiny`` runs the script on a CPU with tiny sizes (figures meaningless): that
keeps it working where no GPU is lent.

Folded in from the harness that first measured cadence on an H100
(``../shared/bench/gpu/gpu_bench.py``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

MLP_VARIANTS = ["raw", "cadence_controller", "cadence_trainer", "cadence_train_loop",
                "cadence_tensorpack"]
LM_VARIANTS = ["raw", "cadence_trainer", "raw_compiled", "cadence_trainer_compiled"]
CKPT_KINDS = ["floor", "async", "sync", "torch_save"]
SYNC_VARIANTS = MLP_VARIANTS[1:]


class Stamper:
    """Times the step range [first, last] (steady state) and snapshots Dynamo's compile count
    at `first`."""

    def __init__(self, first: int, last: int) -> None:
        self.n, self.first, self.last = 0, first, last
        self.t: dict[int, float] = {}
        self.graphs_at_first: int | None = None

    def tick(self) -> None:
        self.n += 1
        if self.n in (self.first, self.last):
            self.t[self.n] = time.perf_counter()
            if self.n == self.first:
                self.graphs_at_first = compiled_graphs()


def compiled_graphs() -> int | None:
    """Graphs Dynamo compiled so far in this process (None before Dynamo is imported)."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------- mlp (launch-bound)

def mlp_setup(device: Any, tiny: bool) -> dict[str, Any]:
    import torch
    from torch import nn

    steps_per_epoch, epochs, batch = (50 if tiny else 1000), 3, 256
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(steps_per_epoch * batch, 64, generator=g)
    y = (x @ torch.randn(64, 10, generator=g)).argmax(dim=1)
    batches = [(x[i:i + batch].to(device), y[i:i + batch].to(device))
               for i in range(0, len(x), batch)]
    stamps = Stamper(steps_per_epoch + 1, steps_per_epoch * epochs)

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128),
                                     nn.ReLU(), nn.Linear(128, 10))

        def forward(self, x: Any) -> Any:
            stamps.tick()
            return self.net(x)

    torch.manual_seed(0)
    return {"batches": batches, "model": MLP().to(device), "epochs": epochs,
            "steps_per_epoch": steps_per_epoch, "total": steps_per_epoch * epochs,
            "stamps": stamps}


def mlp_build(variant: str, s: dict[str, Any], workdir: str, device: Any) -> Any:
    import torch
    import torch.nn.functional as F

    model, batches, total = s["model"], s["batches"], s["total"]

    def sgd() -> Any:
        return torch.optim.SGD(model.parameters(), lr=0.01)

    if variant == "raw":
        optimizer = sgd()

        def train() -> None:
            for _ in range(s["epochs"]):
                for xb, yb in batches:
                    optimizer.zero_grad(set_to_none=True)
                    F.cross_entropy(model(xb), yb).backward()
                    optimizer.step()
            synchronize(device)
        return train

    import cadence

    if variant in ("cadence_controller", "cadence_trainer"):
        if variant == "cadence_controller":
            class Classifier(cadence.StandardTrainer):
                def __init__(self) -> None:
                    super().__init__(batches)
                    self.model, self.optimizer, self.loss = model, sgd(), cadence.Mean()

                def train_loop_begin(self) -> None:
                    self.loss.reset()

                def train_step(self, iterator: Any) -> None:
                    xb, yb = next(iterator)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss = F.cross_entropy(self.model(xb), yb)
                    loss.backward()
                    self.optimizer.step()
                    self.loss.update(loss)

                def train_loop_end(self) -> dict[str, Any]:
                    return {"loss": self.loss.result()}

            trainer: Any = Classifier()
        else:
            class Task(cadence.Task):
                def build_inputs(self, params: Any, input_context: Any = None) -> Any:
                    return batches

                def build_losses(self, labels: Any, model_outputs: Any,
                                 aux_losses: Any = None) -> Any:
                    return F.cross_entropy(model_outputs, labels)

            config = cadence.load_config(cadence.ExperimentConfig(), overrides=[
                f"trainer.train_steps={total}", "trainer.steps_per_loop=100",
                "trainer.summary_interval=100", "trainer.checkpoint_interval=1000",
                f"runtime.device={device}"])
            trainer = cadence.Trainer(config, Task(config.task), model, sgd(), evaluate=False)
        manager = cadence.CheckpointManager(trainer, f"{workdir}/ckpt", checkpoint_interval=1000,
                                            async_save=True)
        controller = cadence.Controller(trainer=trainer, steps_per_loop=100,
                                        summary_dir=f"{workdir}/train", summary_interval=100,
                                        checkpoint_manager=manager,
                                        callbacks=[cadence.ProgressBar(enabled=False)])

        def train() -> None:
            controller.train(total)
            manager.wait()
            synchronize(device)
        return train

    if variant == "cadence_train_loop":
        optimizer = sgd()
        loop = cadence.TrainLoop(model, max_epoch=s["epochs"], checkpoint_dir=f"{workdir}/ckpt",
                                 checkpoint_epoch_freq=1, summary_dir=f"{workdir}/train",
                                 checkpoint_save_objects={"optimizer": optimizer},
                                 print_func=lambda line: None)

        def train() -> None:
            with loop:
                for _ in loop.iter_epochs():
                    for _, (xb, yb) in loop.iter_steps(batches):
                        optimizer.zero_grad(set_to_none=True)
                        loss = F.cross_entropy(model(xb), yb)
                        loss.backward()
                        optimizer.step()
                        loop.collect_metrics(loss=loss)
                    loop.print_logs()
            synchronize(device)
        return train

    if variant == "cadence_tensorpack":
        from cadence.callbacks import ModelSaver
        from cadence.tensorpack import SimpleTrainer, cost_from_model

        tensorpack = SimpleTrainer(logdir=workdir)
        tensorpack.setup_graph(batches, cost_from_model(model, F.cross_entropy),
                               lambda params: torch.optim.SGD(params, lr=0.01), model=model)

        def train() -> None:
            tensorpack.train_with_defaults(callbacks=[ModelSaver()],
                                           steps_per_epoch=s["steps_per_epoch"],
                                           max_epoch=s["epochs"])
            synchronize(device)
        return train
    raise SystemExit(f"unknown mlp variant {variant!r}; known: {', '.join(MLP_VARIANTS)}")


# ---------------------------------------------------------------- lm (compute-bound)

def lm_setup(device: Any, tiny: bool) -> dict[str, Any]:
    import torch

    from cadence.task.experiments.char_lm import CharLMModelConfig, CharTransformer

    steps = 12 if tiny else 120
    length, batch = (32, 4) if tiny else (256, 64)
    config = CharLMModelConfig(dropout=0.0)
    if tiny:
        config.d_model, config.num_layers, config.dim_feedforward = 64, 2, 256
    else:
        config.d_model, config.num_layers, config.num_heads = 512, 8, 8
        config.dim_feedforward = 2048
    tokens = torch.randint(0, 256, (steps, batch, length + 1),
                           generator=torch.Generator().manual_seed(1))
    batches = [(t[:, :-1].to(device), t[:, 1:].to(device)) for t in tokens]
    torch.manual_seed(0)
    model = CharTransformer(config, length).to(device)
    stamps = Stamper(steps // 4, steps)
    model.register_forward_pre_hook(lambda module, inputs: stamps.tick())
    return {"batches": batches, "model": model, "total": steps, "stamps": stamps}


def lm_build(variant: str, s: dict[str, Any], workdir: str, device: Any) -> Any:
    import torch
    import torch.nn.functional as F

    model, batches, steps = s["model"], s["batches"], s["total"]
    compiled = "_compiled" in variant
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    autocast_device = device.type

    def loss_of(outputs: Any, labels: Any) -> Any:
        return F.cross_entropy(outputs.flatten(0, -2).float(), labels.flatten())

    if variant.startswith("raw"):
        forward = torch.compile(model) if compiled else model

        def train() -> None:
            for xb, yb in batches:
                with torch.autocast(autocast_device, dtype=torch.bfloat16):
                    loss = loss_of(forward(xb), yb)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            synchronize(device)
        return train

    import cadence

    class Task(cadence.Task):
        def build_inputs(self, params: Any, input_context: Any = None) -> Any:
            return batches

        def build_losses(self, labels: Any, model_outputs: Any, aux_losses: Any = None) -> Any:
            return loss_of(model_outputs, labels)

    overrides = [f"trainer.train_steps={steps}", "trainer.steps_per_loop=20",
                 "trainer.optimizer_config.gradient_clip_norm=1.0",
                 "runtime.mixed_precision=bf16", f"runtime.device={device}",
                 "trainer.checkpoint_interval=60"]
    if compiled:
        overrides.append("trainer.compile_step=true")
    config = cadence.load_config(cadence.ExperimentConfig(), overrides=overrides)
    trainer = cadence.Trainer(config, Task(config.task), model, optimizer, evaluate=False)
    manager = None
    if not variant.endswith(("_nockpt", "_bare")):
        manager = cadence.CheckpointManager(trainer, f"{workdir}/ckpt", checkpoint_interval=60,
                                            async_save=True)
    controller = cadence.Controller(
        trainer=trainer, steps_per_loop=20, checkpoint_manager=manager,
        summary_dir=None if variant.endswith("_bare") else f"{workdir}/train")

    def train() -> None:
        controller.train(steps)
        if manager is not None:
            manager.wait()
        synchronize(device)
    return train


# ---------------------------------------------------------------- ckpt (stall)

def ckpt_one(kind: str, workdir: str, device: Any, tiny: bool) -> dict[str, Any]:
    import torch
    from torch import nn

    import cadence

    width, depth = (256, 2) if tiny else (4096, 6)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)]).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, width, device=device)).sum().backward()
    optimizer.step()
    synchronize(device)
    state_mb = sum(p.numel() * 3 * 4 for p in model.parameters()) / 1e6
    stalls, completes = [], []
    if kind == "floor":
        tensors = list(model.state_dict().values()) + [
            v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=device.type == "cuda")
                   for t in tensors]
        for _ in range(4):
            t0 = time.perf_counter()
            for buffer, tensor in zip(buffers, tensors):
                buffer.copy_(tensor, non_blocking=True)
            synchronize(device)
            stalls.append(time.perf_counter() - t0)
    elif kind == "torch_save":
        for i in range(3):
            t0 = time.perf_counter()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       f"{workdir}/plain-{i}.pt")
            stalls.append(time.perf_counter() - t0)
            completes.append(stalls[-1])
    else:
        manager = cadence.CheckpointManager({"model": model, "optimizer": optimizer},
                                            f"{workdir}/ckpt", max_to_keep=2,
                                            async_save=kind == "async")
        for i in range(4):
            t0 = time.perf_counter()
            manager.save(i + 1)
            t1 = time.perf_counter()
            manager.wait()
            stalls.append(t1 - t0)
            completes.append(time.perf_counter() - t0)
    return {"state_mb": state_mb, "stalls": stalls, "completes": completes}


# ---------------------------------------------------------------- syncs

def syncs_one(variant: str, workdir: str, device: Any, tiny: bool) -> dict[str, Any]:
    import cadence

    s = mlp_setup(device, tiny=True)  # passes of 50 batches
    s["epochs"] = 3 if tiny else 6
    s["total"] = s["steps_per_epoch"] * s["epochs"]  # 300 steps on a GPU
    train = mlp_build(variant, s, workdir, device)
    with cadence.debug.count_host_syncs() as syncs:
        train()
    where: dict[str, int] = {}
    for name, place in syncs.calls:
        key = f"{name} @ {place[-80:]}"
        where[key] = where.get(key, 0) + 1
    return {"count": syncs.count, "steps": s["total"], "where": where}


# ---------------------------------------------------------------- gpt: tokens/s and MFU

GPT_VARIANTS = ["raw", "trainer", "raw_compiled", "trainer_compiled"]


def gpt_one(variant: str, workdir: str, device: Any, tiny: bool) -> dict[str, Any]:
    """GPT-2 small in bf16 through ``benchmarks/gpt.py`` (in a process of its own): its
    record -- steady tokens per second, TFLOPS, MFU where the device's peak is known."""
    import subprocess
    import sys

    if variant not in GPT_VARIANTS:
        raise SystemExit(f"gpt: variant {variant!r} must be one of {', '.join(GPT_VARIANTS)}")
    out = Path(workdir) / f"gpt-{variant}.json"
    kind = variant.removesuffix("_compiled")
    command = [sys.executable, str(Path(__file__).with_name("gpt.py")), kind, "--out", str(out),
               "--workdir", workdir, "--size", "test" if tiny else "124m",
               "--precision", "bf16", "--device", device.type]
    if variant.endswith("_compiled"):
        command.append("--compile")
    if tiny:
        command += ["--steps", "20"]
    subprocess.run(command, check=True)
    return dict(json.loads(out.read_text()))


# ---------------------------------------------------------------- driver

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=("mlp", "lm", "ckpt", "syncs", "gpt"))
    parser.add_argument("variant")
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()

    import torch

    device = torch.device(args.device)
    if device.type == "cuda":  # the same precision for every variant
        torch.set_float32_matmul_precision("high")
    record: dict[str, Any] = {"workload": args.workload, "variant": args.variant,
                              "device": str(device)}
    if args.workload in ("mlp", "lm"):
        setup, build = (mlp_setup, mlp_build) if args.workload == "mlp" else (lm_setup, lm_build)
        s = setup(device, args.tiny)
        train = build(args.variant, s, args.workdir, device)
        synchronize(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        train()
        elapsed = time.perf_counter() - t0
        stamps = s["stamps"]
        record.update(us_per_step=elapsed / s["total"] * 1e6, steps_seen=stamps.n)
        if len(stamps.t) == 2:
            record["steady_us_per_step"] = ((stamps.t[stamps.last] - stamps.t[stamps.first])
                                            / (stamps.last - stamps.first) * 1e6)
        graphs = compiled_graphs()
        if "_compiled" in args.variant and graphs is not None \
                and stamps.graphs_at_first is not None:
            record["recompiles"] = graphs - stamps.graphs_at_first
        if device.type == "cuda":
            record["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 1e6
    elif args.workload == "ckpt":
        record.update(ckpt_one(args.variant, args.workdir, device, args.tiny))
    elif args.workload == "gpt":
        record.update(gpt_one(args.variant, args.workdir, device, args.tiny))
    else:
        record.update(syncs_one(args.variant, args.workdir, device, args.tiny))
    Path(args.out).write_text(json.dumps(record))


if __name__ == "__main__":
    main()
