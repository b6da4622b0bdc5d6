"""A user's mixture-of-experts decoder, written as a user writes one -- not by cadence's rules.

Each block routes every token to one of its experts (an ``nn.ModuleList`` nested inside the
block's ``nn.ModuleList``) and leaves a load-balancing loss behind, which the model hands over
as ``model.aux_losses``; the token embedding is tied to the head; the positions are one learned
parameter of shape ``(1, T, D)``. Under FSDP2 on several ranks these are the shapes that break
naive checks: the position parameter's first dimension of 1 leaves every rank but the first an
*empty* shard, the embedding's 256 rows and the width of 30 split unevenly over 3 or 4 ranks.

The experiment ``user_moe`` trains it on cadence's byte-level text (the ``gpt`` experiment's
data, losses and metrics); importing this module registers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

import cadence
from cadence.task.config import Config
from cadence.task.experiments.gpt import GPTTask, GPTTaskConfig, gpt_experiment


@dataclass
class MoEConfig(Config):
    width: int = 30
    heads: int = 2
    layers: int = 3
    experts: int = 3
    balance_weight: float = 0.01


class Expert(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class MoEBlock(nn.Module):
    """Attention, then a top-1 routed mixture of experts; keeps its balance loss."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.width)
        self.attn = nn.MultiheadAttention(config.width, config.heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(config.width)
        self.router = nn.Linear(config.width, config.experts, bias=False)
        self.experts = nn.ModuleList(Expert(config.width) for _ in range(config.experts))
        self.balance_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        length = x.shape[1]
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool, device=x.device), 1)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        h = self.ln_2(x)
        probabilities = self.router(h).softmax(-1)
        chosen = probabilities.argmax(-1)
        mixed = torch.zeros_like(h)
        for index, expert in enumerate(self.experts):
            routed = (chosen == index).unsqueeze(-1).to(h.dtype)
            mixed = mixed + routed * probabilities[..., index:index + 1] * expert(h)
        load = F.one_hot(chosen, len(self.experts)).float().mean((0, 1))
        self.balance_loss = len(self.experts) * (load * probabilities.mean((0, 1))).sum()
        return x + mixed


class MoEDecoder(nn.Module):
    def __init__(self, config: MoEConfig, length: int, vocab: int = 256) -> None:
        super().__init__()
        self.balance_weight = config.balance_weight
        self.embedding = nn.Embedding(vocab, config.width)
        self.positions = nn.Parameter(torch.randn(1, length, config.width) * 0.02)
        self.blocks = nn.ModuleList(MoEBlock(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, vocab, bias=False)
        self.head.weight = self.embedding.weight  # tied
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) + self.positions[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    @property
    def aux_losses(self) -> list[torch.Tensor]:
        """The blocks' balance losses of the last forward (what cadence adds to the loss)."""
        return [self.balance_weight * block.balance_loss for block in self.blocks
                if block.balance_loss is not None]


@dataclass
class MoETaskConfig(GPTTaskConfig):
    moe: MoEConfig = field(default_factory=MoEConfig)


@cadence.register_task(MoETaskConfig)
class MoETask(GPTTask):
    def build_model(self) -> nn.Module:
        return MoEDecoder(self.task_config.moe, self.task_config.sequence_length)

    def build_losses(self, labels, model_outputs, aux_losses=None):
        loss = super().build_losses(labels, model_outputs)
        return loss + sum(aux_losses or [])


@cadence.register_experiment("user_moe")
def experiment() -> cadence.ExperimentConfig:
    """The MoE decoder on the stdlib's bytes, with gradient clipping (the ``gpt`` recipe)."""
    config = gpt_experiment()
    fields = {name: getattr(config.task, name) for name in GPTTaskConfig.__dataclass_fields__}
    config.task = MoETaskConfig(**fields)
    return config
