"""A GAN with two optimizers and several updates per step (tensorpack's multi-update case).

The generator learns to turn noise into samples of N(4, 1.25). Each logical step updates the
discriminator `d_steps` times and the generator once, in `run_step`; the global step counts
steps, not optimizer calls. Checkpoints (both networks, both optimizers, the step) are taken
every epoch by `ModelSaver`; running again resumes.

    python examples/gan_1d.py --logdir runs/gan
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

import cadence
from cadence.callbacks import ModelSaver, ScalarPrinter
from cadence.tensorpack import Trainer

TARGET_MEAN, TARGET_STD = 4.0, 1.25


class GANTrainer(Trainer):
    """Two networks, two optimizers; `run_step` is the override point."""

    def __init__(self, logdir: str | None, d_steps: int = 2, batch_size: int = 64) -> None:
        super().__init__(logdir)
        self.generator = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
        self.discriminator = nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, 1))
        self.g_optimizer = torch.optim.Adam(self.generator.parameters(), lr=2e-3,
                                            betas=(0.5, 0.999))
        self.d_optimizer = torch.optim.Adam(self.discriminator.parameters(), lr=2e-3,
                                            betas=(0.5, 0.999))
        self.d_steps = d_steps
        self.batch_size = batch_size
        self.d_loss, self.g_loss = cadence.Mean(), cadence.Mean()

    def sample(self, n: int) -> torch.Tensor:
        return self.generator(torch.randn(n, 4))

    def run_step(self) -> None:
        bce = nn.functional.binary_cross_entropy_with_logits
        n = self.batch_size
        for _ in range(self.d_steps):
            real = torch.randn(n, 1) * TARGET_STD + TARGET_MEAN
            fake = self.sample(n).detach()
            logits = self.discriminator(torch.cat([real, fake]))
            labels = torch.cat([torch.ones(n, 1), torch.zeros(n, 1)])
            loss = bce(logits, labels)
            self.d_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.d_optimizer.step()
            self.d_loss.update(loss.detach())
        loss = bce(self.discriminator(self.sample(n)), torch.ones(n, 1))
        self.g_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.g_optimizer.step()
        self.g_loss.update(loss.detach())

    def epoch_logs(self) -> dict[str, Any]:
        with torch.no_grad():
            samples = self.sample(2000)
        logs = {"d_loss": self.d_loss.result(), "g_loss": self.g_loss.result(),
                "sample_mean": samples.mean(), "sample_std": samples.std()}
        self.d_loss.reset()
        self.g_loss.reset()
        return logs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logdir", default="runs/gan")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--steps-per-epoch", type=int, default=150)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    trainer = GANTrainer(args.logdir)
    trainer.train(callbacks=[ModelSaver(max_to_keep=2)], monitors=[ScalarPrinter()],
                  steps_per_epoch=args.steps_per_epoch, max_epoch=args.epochs)
    with torch.no_grad():
        samples = trainer.sample(5000)
    return {"global_step": trainer.global_step, "mean": float(samples.mean()),
            "std": float(samples.std()), "trainer": trainer}


if __name__ == "__main__":
    result = main()
    print({k: v for k, v in result.items() if k != "trainer"})
