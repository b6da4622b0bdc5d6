"""Compute-bound: the char transformer (cadence's ``char_lm`` model) on CPU, a raw loop vs the
Task `Trainer` driven by a `Controller` with its defaults (metrics, summaries, async checkpoints).
The raw loop does the Trainer's work -- the loss, the accuracy and the gradient norm accumulated
on the device, read once per loop -- so that the ratio is the framework's cost alone (the
Trainer's checkpoint and summaries are its own, and count against it).

usage: python benchmarks/compute_bound.py {raw,trainer} --steps 40 --out FILE.json --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("raw", "trainer"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    import cadence
    from cadence.task.experiments.char_lm import CharLMModelConfig, CharTransformer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    length, batch = 128, 32
    tokens = torch.randint(0, 256, (args.steps, batch, length + 1),
                           generator=torch.Generator().manual_seed(1))
    batches = [(t[:, :-1], t[:, 1:]) for t in tokens]
    model = CharTransformer(CharLMModelConfig(), length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_of(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, -2), labels.flatten())

    if args.kind == "raw":
        def train() -> None:
            # The Trainer's work, by hand: the loss, the accuracy and the gradient norm
            # accumulated on the device, read on the host once per loop of 10 steps.
            totals = [torch.zeros(()) for _ in range(4)]
            loss_sum, norm_sum, correct, count = totals
            for step, (x, y) in enumerate(batches):
                outputs = model(x)
                loss = loss_of(outputs, y)
                correct.add_((outputs.detach().argmax(dim=-1) == y).sum())
                count.add_(y.numel())
                loss_sum.add_(loss.detach())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                norm_sum.add_(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
                optimizer.step()
                if (step + 1) % 10 == 0:
                    torch.stack([loss_sum / 10, correct / count, norm_sum / 10]).tolist()
                    for total in totals:
                        total.zero_()
    else:
        class Task(cadence.Task):
            def build_inputs(self, params, input_context=None):
                return batches

            def build_losses(self, labels, model_outputs, aux_losses=None):
                return loss_of(model_outputs, labels)

            def build_metrics(self, training=True):
                return {"accuracy": cadence.Accuracy()}

        config = cadence.load_config(cadence.ExperimentConfig(), overrides=[
            f"trainer.train_steps={args.steps}", "trainer.steps_per_loop=10",
            "trainer.optimizer_config.gradient_clip_norm=1.0",
            "runtime.device=cpu"])  # the raw loop's device, also where CUDA is visible
        trainer = cadence.Trainer(config, Task(config.task), model, optimizer, evaluate=False)
        manager = cadence.CheckpointManager(trainer, f"{args.workdir}/ckpt",
                                            checkpoint_interval=20, async_save=True)
        controller = cadence.Controller(trainer=trainer, steps_per_loop=10,
                                        summary_dir=f"{args.workdir}/train",
                                        checkpoint_manager=manager)

        def train() -> None:
            controller.train(args.steps)
            manager.wait()

    stamps: list[float] = []
    first_counted = max(args.steps // 4, 1)  # steady state: after one-time costs (imports...)

    def stamp(module: torch.nn.Module, inputs: object) -> None:
        stamps.append(time.perf_counter())

    model.register_forward_pre_hook(stamp)
    start = time.perf_counter()
    train()
    end = time.perf_counter()
    # Steady state: from the forward of step `first_counted` to the forward of the last step,
    # so that neither one-time start costs nor the end of training (the final checkpoint's
    # write, which the whole-run figure includes) count.
    steady = (stamps[-1] - stamps[first_counted]) / (len(stamps) - 1 - first_counted)
    Path(args.out).write_text(json.dumps({"kind": args.kind,
                                          "ms_per_step": (end - start) / args.steps * 1e3,
                                          "steady_ms_per_step": steady * 1e3}))


if __name__ == "__main__":
    main()
