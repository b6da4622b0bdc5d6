"""A character-level transformer language model trained on the Python standard library's source.

Every Python installation carries its standard library as ``.py`` files, so this experiment
needs no download: the text is the first ``max_bytes`` bytes of those files (sorted by path,
tests and site-packages left out), modelled byte by byte (a vocabulary of 256). The last
``validation_fraction`` of the text is held out.

* ``char_lm``: a small model for a CPU (minutes); tests shrink it further with ``--set``.
* ``char_lm_large``: a larger model meant for a GPU (bf16, compiled step).

Evaluation reports ``accuracy`` (next byte) and ``bits_per_char``, the latter reduced on the host
from the per-step losses through ``aggregate_logs`` / ``reduce_aggregated_logs``.
"""

from __future__ import annotations

import math
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from cadence.core.errors import ConfigError
from cadence.data.sharding import InputContext, build_dataloader
from cadence.engine.metrics import Accuracy
from cadence.task.config import (
    Config,
    DataConfig,
    EMAConfig,
    ExperimentConfig,
    LearningRateConfig,
    OptimizationConfig,
    OptimizerConfig,
    RuntimeConfig,
    TaskConfig,
    TrainerConfig,
)
from cadence.task.config_checks import FRACTION, POSITIVE_INT, range_problem
from cadence.task.registry import register_experiment, register_task
from cadence.task.task import Task

VOCAB_SIZE = 256


@dataclass
class CharLMModelConfig(Config):
    """The transformer.

    Attributes:
        d_model: width of the residual stream.
        num_layers: transformer blocks.
        num_heads: attention heads per block.
        dim_feedforward: width of each block's MLP.
        dropout: dropout in the blocks.
    """

    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    dim_feedforward: int = 512
    dropout: float = 0.1


@dataclass
class CharLMTaskConfig(TaskConfig):
    """The language-modelling task.

    Attributes:
        sequence_length: bytes of context per example.
        max_bytes: how much of the standard library's source to read.
        validation_fraction: the share of the text (at its end) held out.
    """

    model: CharLMModelConfig = field(default_factory=CharLMModelConfig)
    sequence_length: int = 128
    max_bytes: int = 2_000_000
    validation_fraction: float = 0.1

    def problems(self) -> Iterable[str]:
        yield from super().problems()
        yield from text_problems(self)


def text_problems(config: Any) -> Iterable[str]:
    """What is wrong with a language-model task's text options: `max_bytes` a positive
    integer, `validation_fraction` in (0, 1) (both parts of the text must hold tokens)."""
    for problem in (range_problem("task.max_bytes", config.max_bytes, POSITIVE_INT),
                    range_problem("task.validation_fraction", config.validation_fraction,
                                  FRACTION, "the share of the text held out")):
        if problem is not None:
            yield problem


def stdlib_files(max_bytes: int) -> list[bytes]:
    """The standard library's ``.py`` files in path order, as many as make `max_bytes` bytes
    (the last one cut there): each file one document."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).parts
        if any(part in ("site-packages", "dist-packages") or part.startswith("test")
               for part in relative):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data[:max_bytes - total])
        total += len(chunks[-1])
        if total >= max_bytes:
            break
    if total < 10_000:
        raise RuntimeError(f"Found only {total} bytes of Python source under {root}; the "
                           "char_lm experiment needs the standard library's .py files.")
    return [chunk for chunk in chunks if chunk]


def stdlib_text(max_bytes: int) -> bytes:
    """The first `max_bytes` bytes of the standard library's ``.py`` files, in path order."""
    return b"".join(stdlib_files(max_bytes))


class ByteWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of a byte sequence: (input bytes, the bytes that follow)."""

    def __init__(self, tokens: torch.Tensor, sequence_length: int) -> None:
        self.tokens = tokens
        self.sequence_length = sequence_length

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.sequence_length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.sequence_length
        window = self.tokens[start: start + self.sequence_length + 1].long()
        return window[:-1], window[1:]


class CharTransformer(nn.Module):
    """A decoder-only transformer over bytes (pre-norm blocks, learned positions, tied head)."""

    causal_mask: torch.Tensor

    def __init__(self, config: CharLMModelConfig, sequence_length: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB_SIZE, config.d_model)
        self.position = nn.Parameter(torch.zeros(sequence_length, config.d_model))
        layer = nn.TransformerEncoderLayer(
            config.d_model, config.num_heads, config.dim_feedforward, config.dropout,
            activation="gelu", batch_first=True, norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, config.num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, VOCAB_SIZE, bias=False)
        self.head.weight = self.embedding.weight
        nn.init.normal_(self.position, std=0.02)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.register_buffer(
            "causal_mask", nn.Transformer.generate_square_subsequent_mask(sequence_length),
            persistent=False,
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embedding(tokens) + self.position[:length]
        x = self.blocks(x, mask=self.causal_mask[:length, :length], is_causal=True)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits

    @torch.no_grad()
    def generate(self, prompt: bytes, num_bytes: int, temperature: float = 0.8,
                 generator: torch.Generator | None = None) -> bytes:
        """Continues `prompt` by sampling `num_bytes` bytes."""
        device = self.embedding.weight.device
        tokens = torch.tensor(list(prompt), dtype=torch.long, device=device)[None]
        context = self.position.shape[0]
        for _ in range(num_bytes):
            logits = self(tokens[:, -context:])[0, -1] / temperature
            probs = torch.softmax(logits.float(), dim=-1).cpu()
            token = torch.multinomial(probs, 1, generator=generator).to(device)
            tokens = torch.cat([tokens, token[None]], dim=1)
        return bytes(tokens[0, len(prompt):].tolist())


def shape_problems(model: Any, sizes: tuple[str, ...], width: str, heads: str) -> list[str]:
    """What is wrong with a transformer's config, one phrase each: every one of `sizes` must be
    at least 1, `width` a multiple of `heads`, the dropout in [0, 1)."""
    problems = [f"task.model.{name} (got {getattr(model, name)}) must be >= 1"
                for name in sizes if getattr(model, name) < 1]
    if not problems and getattr(model, width) % getattr(model, heads):
        problems.append(f"task.model.{width} (got {getattr(model, width)}) must be a multiple "
                        f"of task.model.{heads} (got {getattr(model, heads)})")
    if not 0 <= model.dropout < 1:
        problems.append(f"task.model.dropout (got {model.dropout}) must be in [0, 1)")
    return problems


def language_model_config(task: TaskConfig, batch_size: int, trainer: TrainerConfig,
                          runtime: RuntimeConfig) -> ExperimentConfig:
    """An experiment of a language-model task: `task` with the same global batch size for
    training and validation."""
    task.train_data = type(task.train_data)(global_batch_size=batch_size, is_training=True)
    task.validation_data = type(task.validation_data)(global_batch_size=batch_size,
                                                      is_training=False)
    return ExperimentConfig(task=task, trainer=trainer, runtime=runtime)


@register_task(CharLMTaskConfig)
class CharLMTask(Task):
    """Next-byte prediction on the standard library's source."""

    def build_model(self) -> nn.Module:
        """The transformer.

        Raises:
            ConfigError: for a model config it cannot be built from.
        """
        model, length = self.task_config.model, self.task_config.sequence_length
        problems = shape_problems(model, ("d_model", "num_layers", "num_heads",
                                          "dim_feedforward"), "d_model", "num_heads")
        if length < 1:
            problems.append(f"task.sequence_length (got {length}) must be >= 1")
        if problems:
            raise ConfigError("; ".join(problems) + ".")
        return CharTransformer(model, length)

    def build_inputs(self, params: DataConfig,
                     input_context: InputContext | None = None) -> DataLoader[Any]:
        config = self.task_config
        text = torch.frombuffer(bytearray(stdlib_text(config.max_bytes)), dtype=torch.uint8)
        cut = int(len(text) * (1.0 - config.validation_fraction))
        split = params.split or ("train" if params.is_training else "validation")
        tokens = text[:cut] if split == "train" else text[cut:]
        return build_dataloader(ByteWindows(tokens, config.sequence_length), params,
                                input_context)

    def build_losses(self, labels: torch.Tensor, model_outputs: torch.Tensor,
                     aux_losses: Any = None) -> torch.Tensor:
        return nn.functional.cross_entropy(model_outputs.flatten(0, -2).float(),
                                           labels.flatten())

    def build_metrics(self, training: bool = True) -> dict[str, Accuracy]:
        return {"accuracy": Accuracy()}

    def aggregate_logs(self, state: Any = None, step_logs: Any = None) -> Any:
        """Collects each step's mean loss (still on the device: no sync per step)."""
        state = state if state is not None else []
        state.append(step_logs[self.loss].detach().float())
        return state

    def reduce_aggregated_logs(self, aggregated_logs: Any,
                               global_step: int | None = None) -> dict[str, Any]:
        """``bits_per_char``: the mean loss in bits (steps have equal sizes)."""
        if not aggregated_logs:
            return {}
        return {"bits_per_char": torch.stack(aggregated_logs).mean() / math.log(2)}


def _char_lm_config(model: CharLMModelConfig, sequence_length: int, max_bytes: int,
                    batch_size: int, trainer: TrainerConfig,
                    runtime: RuntimeConfig) -> ExperimentConfig:
    task = CharLMTaskConfig(model=model, sequence_length=sequence_length, max_bytes=max_bytes)
    return language_model_config(task, batch_size, trainer, runtime)


@register_experiment("char_lm")
def char_lm_experiment() -> ExperimentConfig:
    """Byte-level transformer LM on the stdlib's source; small, for a CPU."""
    return _char_lm_config(
        CharLMModelConfig(), sequence_length=128, max_bytes=2_000_000, batch_size=32,
        trainer=TrainerConfig(
            train_steps=2000, steps_per_loop=50, checkpoint_interval=500, validation_steps=20,
            validation_interval=500, best_checkpoint_eval_metric="bits_per_char",
            best_checkpoint_metric_comp="lower",
            optimizer_config=OptimizationConfig(
                optimizer=OptimizerConfig(name="adamw", learning_rate=1e-3, weight_decay=0.01),
                learning_rate=LearningRateConfig(schedule="cosine", warmup_steps=100,
                                                 end_factor=0.1),
                gradient_clip_norm=1.0,
            ),
        ),
        runtime=RuntimeConfig(seed=0),
    )


@register_experiment("char_lm_large")
def char_lm_large_experiment() -> ExperimentConfig:
    """Byte-level transformer LM on the stdlib's source; larger, for a GPU (bf16, compiled)."""
    return _char_lm_config(
        CharLMModelConfig(d_model=512, num_layers=8, num_heads=8, dim_feedforward=2048),
        sequence_length=256, max_bytes=20_000_000, batch_size=64,
        trainer=TrainerConfig(
            train_steps=20000, steps_per_loop=200, summary_interval=200,
            checkpoint_interval=2000, validation_steps=100, validation_interval=2000,
            best_checkpoint_eval_metric="bits_per_char", best_checkpoint_metric_comp="lower",
            compile_step=True, ema=EMAConfig(enabled=True, decay=0.999),
            optimizer_config=OptimizationConfig(
                optimizer=OptimizerConfig(name="adamw", learning_rate=6e-4, weight_decay=0.1,
                                          betas=[0.9, 0.95]),
                learning_rate=LearningRateConfig(schedule="cosine", warmup_steps=1000,
                                                 end_factor=0.1),
                gradient_clip_norm=1.0,
            ),
        ),
        runtime=RuntimeConfig(device="auto", mixed_precision="bf16", seed=0),
    )
