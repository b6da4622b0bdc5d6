"""A GPT-2-style language model on the Python standard library's source: the reference model.

The model is GPT-2's decoder as nanoGPT writes it: a token embedding tied to the output head,
learned positions, pre-LayerNorm blocks in an ``nn.ModuleList`` (causal self-attention through
``scaled_dot_product_attention`` -- its query, key and value projections three Linears, where
nanoGPT fuses them, so that tensor parallelism splits them by heads: `GPT.tensor_parallel_plan`
--, a GELU MLP), a final LayerNorm, and GPT-2's initialization
(normal(0, 0.02), the residual projections scaled by ``1/sqrt(2 * n_layer)``). The blocks are
what `cadence.parallelize_model` finds: each is a unit of FSDP2, activation checkpointing and
per-block compile, and the tied embedding and head stay together in the root's group.

The data are token shards (`cadence.data.token_shards`): by default the standard library's
source as bytes (no tokenizer, nothing downloaded), each file a document, prepared on first use
into a cache folder (``$CADENCE_CACHE_DIR``, else ``$XDG_CACHE_HOME/cadence``, else
``~/.cache/cadence``) and read from there; or a user's own through
``task.train_data.input_path`` and ``task.validation_data.input_path`` (nanoGPT's ``train.bin``
and ``val.bin``, prepared folders, globs, a mixture with ``input_weights``). Training reads a
`TokenLoader` (exact resume at any number of data shards). With ``packing`` the model is given
position ids, and its attention stays inside each document (`document_causal_mask`).
``vocab_size`` may be larger than the tokens need -- ``gpt2_small`` uses GPT-2's padded 50,304
-- so that the model has GPT-2 small's shape and cost (124M parameters).

* ``gpt``: a small model for a CPU (4 layers, 128 wide; tests shrink it with ``--set``).
* ``gpt2_small``: GPT-2 small (12 layers, 768 wide, 12 heads, 1,024 tokens of context), bf16,
  compiled per block, for a GPU.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from cadence.core.errors import ConfigError
from cadence.data.packing import document_causal_mask
from cadence.data.sharding import InputContext
from cadence.data.token_format import (
    VERSION,
    begin_token_folder,
    finish_token_folder,
    write_shard,
)
from cadence.data.token_loader import build_token_inputs
from cadence.task.config import (
    Config,
    DataConfig,
    ExperimentConfig,
    LearningRateConfig,
    OptimizationConfig,
    OptimizerConfig,
    RuntimeConfig,
    TaskConfig,
    TokenDataConfig,
    TrainerConfig,
)
from cadence.task.experiments.char_lm import (
    CharLMTask,
    language_model_config,
    shape_problems,
    stdlib_files,
    text_problems,
)
from cadence.task.registry import register_experiment, register_task


@dataclass
class GPTModelConfig(Config):
    """GPT-2's hyper-parameters (nanoGPT's names).

    Attributes:
        vocab_size: rows of the embedding and the head; 256 covers bytes, 50304 is GPT-2's
            vocabulary padded to a multiple of 64.
        block_size: the longest context (rows of the position embedding).
        n_layer: transformer blocks.
        n_head: attention heads per block.
        n_embd: width of the residual stream.
        dropout: dropout of the embeddings, attention and MLP outputs.
        bias: biases in the Linear layers and LayerNorms (GPT-2 has them).
    """

    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; the kernel is ``scaled_dot_product_attention``'s."""

    def __init__(self, config: GPTModelConfig) -> None:
        super().__init__()
        self.head_dim, self.dropout = config.n_embd // config.n_head, config.dropout
        # Query, key and value are three Linears (nanoGPT fuses them in one, c_attn): tensor
        # parallelism splits each by whole heads, which a fused weight's rows do not line up with.
        self.q_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.k_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.v_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention; with `attn_mask` (packed documents, `document_causal_mask`) where
        it allows."""
        batch, length, _ = x.shape
        # -1 heads: under tensor parallelism a rank holds n_head / tp of them
        q, k, v = (projection(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
                   for projection in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0,
            is_causal=attn_mask is None)
        y = y.transpose(1, 2).contiguous().view(batch, length, -1)
        out: torch.Tensor = self.resid_dropout(self.c_proj(y))
        return out


class MLP(nn.Module):
    """The block's feed-forward part: 4x wider, GELU (tanh approximation, as GPT-2)."""

    def __init__(self, config: GPTModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dropout(self.c_proj(self.gelu(self.c_fc(x))))
        return out


class Block(nn.Module):
    """A pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, config: GPTModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attn_mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2's decoder: tied token embedding and head, learned positions, `Block` x n_layer."""

    def __init__(self, config: GPTModelConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self.apply(self._init_weights)
        for name, parameter in self.named_parameters():  # GPT-2: scaled residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, input_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """The logits of every position. With `position_ids` (packed documents: they restart
        at 0 where a document starts) each token attends only inside its own document.
        `inputs_embeds` -- the embeddings' output, what enters the first block -- stands in for
        `input_ids` (transformers' keyword): a pipeline stage after the first gives the hidden
        state of the stage before (`cadence.engine.pipeline_stages`)."""
        mask = None if position_ids is None else document_causal_mask(position_ids)
        if inputs_embeds is not None:
            x = inputs_embeds
        elif input_ids is not None:
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
            x = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        else:
            raise ValueError("GPT.forward: pass input_ids or inputs_embeds.")
        for block in self.blocks:
            x = block(x, mask)
        logits: torch.Tensor = self.lm_head(self.ln_f(x))
        return logits

    def tensor_parallel_plan(self) -> dict[str, Any]:
        """How tensor parallelism splits the model (`cadence.engine.tensor_parallel`): the
        attention's query, key and value by columns (whole heads) and its output projection by
        rows; the MLP's first layer by columns, its second by rows; the tied token embedding
        and head by vocabulary rows, both with whole outputs. The positions, the norms and the
        residual stream are replicated."""
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {
            "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "blocks.*.attn.q_proj": ColwiseParallel(),
            "blocks.*.attn.k_proj": ColwiseParallel(),
            "blocks.*.attn.v_proj": ColwiseParallel(),
            "blocks.*.attn.c_proj": RowwiseParallel(),
            "blocks.*.mlp.c_fc": ColwiseParallel(),
            "blocks.*.mlp.c_proj": RowwiseParallel(),
            "lm_head": ColwiseParallel(output_layouts=Replicate()),
        }

    def num_parameters(self, non_embedding: bool = True) -> int:
        """Parameters, counted once (the tied head is the embedding); without the position
        embedding when `non_embedding` (as GPT-2's papers count)."""
        total = sum(p.numel() for p in self.parameters())
        return total - self.wpe.weight.numel() if non_embedding else total

    def flops_per_token(self, sequence_length: int) -> float:
        """Training FLOPs per token (forward and backward): ``6 N + 12 L H Q T`` (PaLM's
        appendix B, as nanoGPT estimates MFU)."""
        config = self.config
        return (6 * self.num_parameters()
                + 12 * config.n_layer * config.n_embd * sequence_length)


@dataclass
class GPTTaskConfig(TaskConfig):
    """Language modelling on the standard library's bytes with `GPT`.

    Attributes:
        sequence_length: tokens of context per example (at most ``model.block_size``).
        max_bytes: how much of the standard library's source to read.
        validation_fraction: the share of the text (at its end) held out.
    """

    model: GPTModelConfig = field(default_factory=GPTModelConfig)
    sequence_length: int = 128
    max_bytes: int = 2_000_000
    validation_fraction: float = 0.1
    train_data: TokenDataConfig = field(
        default_factory=lambda: TokenDataConfig(is_training=True))
    validation_data: TokenDataConfig = field(
        default_factory=lambda: TokenDataConfig(is_training=False, drop_remainder=False))

    def problems(self) -> Iterable[str]:
        yield from super().problems()
        yield from text_problems(self)
        train, validation = self.train_data, self.validation_data
        count = len([part for part in train.input_path.split(",") if part.strip()])
        if train.input_weights and len(train.input_weights) != count:
            yield (f"task.train_data.input_weights (got {list(train.input_weights)}) must give "
                   f"one weight per comma-separated entry of task.train_data.input_path "
                   f"({count})")
        if validation.input_weights:
            yield ("task.validation_data.input_weights must be empty: evaluation reads every "
                   "entry of its input_path in order")


@register_task(GPTTaskConfig)
class GPTTask(CharLMTask):
    """Next-byte prediction with `GPT` (the data, losses and metrics of ``char_lm``)."""

    def build_model(self) -> nn.Module:
        """The GPT.

        Raises:
            ConfigError: for a model config it cannot be built from.
        """
        model, length = self.task_config.model, self.task_config.sequence_length
        problems = shape_problems(model, ("n_layer", "n_head", "n_embd", "block_size"),
                                  "n_embd", "n_head")
        if model.vocab_size < 256:
            problems.append(f"task.model.vocab_size (got {model.vocab_size}) must be >= 256: "
                            "the tokens are bytes")
        if not 1 <= length <= model.block_size:
            problems.append(f"task.sequence_length (got {length}) must be in [1, "
                            f"task.model.block_size = {model.block_size}]")
        if problems:
            raise ConfigError("; ".join(problems) + ".")
        return GPT(model)

    def tokens_per_example(self) -> int:
        """Tokens in an example: the sequence length (what the throughput counts)."""
        return self.task_config.sequence_length

    def flops_per_token(self, model: nn.Module) -> float | None:
        """`GPT.flops_per_token` at the task's sequence length (``6 N + 12 L H Q T``); None
        for a model of a subclass's that is not a `GPT`."""
        if not isinstance(model, GPT):
            return None
        return model.flops_per_token(self.task_config.sequence_length)

    def build_inputs(self, params: DataConfig,
                     input_context: InputContext | None = None) -> Any:
        """Token shards: ``params.input_path``, else the standard library's bytes (prepared
        into the cache on first use, `stdlib_token_folders`). Training: a `TokenLoader`;
        evaluation: a DataLoader over the windows in order.

        Raises:
            ConfigError: for token files that cannot be read, tokens outside the model's
                vocabulary, or validation data of the standard library for a model trained on
                the user's tokens (``task.validation_data.input_path`` empty).
        """
        config = self.task_config
        if not params.is_training and not getattr(params, "input_path", "") and (
                config.train_data.input_path):
            raise ConfigError(
                "task.validation_data.input_path is empty while task.train_data.input_path is "
                f"set ({config.train_data.input_path!r}): name the validation tokens of the same "
                "tokenizer (e.g. val.bin), or run with --mode train.")
        if not getattr(params, "input_path", ""):  # a plain DataConfig given by hand too
            folders = stdlib_token_folders(config.max_bytes, config.validation_fraction)
            split = params.split or ("train" if params.is_training else "validation")
            values = {item.name: getattr(params, item.name) for item in fields(params)}
            params = TokenDataConfig(**{**values, "input_path": str(folders[split])})
        return build_token_inputs(params, input_context, sequence_length=config.sequence_length,
                                  vocab_size=config.model.vocab_size)


def cache_dir() -> Path:
    """Where cadence keeps data it prepares itself: ``$CADENCE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/cadence``, else ``~/.cache/cadence``."""
    if os.environ.get("CADENCE_CACHE_DIR"):
        return Path(os.environ["CADENCE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "cadence"


def stdlib_token_folders(max_bytes: int, validation_fraction: float) -> dict[str, Path]:
    """The standard library's first `max_bytes` bytes as prepared token shards, byte tokens,
    each file a document: the last `validation_fraction` of the bytes in ``validation``, the
    rest in ``train``. Prepared on first use into the cache (each folder whole or not at all:
    processes that prepare it at once keep the first one finished) and read from there after."""
    key = hashlib.sha256(repr((VERSION, sys.version, sysconfig.get_paths()["stdlib"],
                               max_bytes, validation_fraction)).encode()).hexdigest()[:16]
    root = cache_dir() / f"gpt-stdlib-bytes-{key}"
    folders = {split: root / split for split in ("train", "validation")}
    if all(folder.is_dir() for folder in folders.values()):
        return folders
    files = stdlib_files(max_bytes)
    text = np.frombuffer(b"".join(files), dtype=np.uint8).astype(np.uint16)
    starts = np.cumsum([0] + [len(file) for file in files[:-1]], dtype=np.int64)
    cut = int(len(text) * (1.0 - validation_fraction))
    parts = {"train": (text[:cut], starts[starts < cut]),
             "validation": (text[cut:], np.unique(np.concatenate([[0], starts[starts >= cut]
                                                                  - cut])))}
    for split, folder in folders.items():
        if folder.is_dir():
            continue
        tokens, documents = parts[split]
        try:
            partial = begin_token_folder(folder)
        except ConfigError:
            if folder.is_dir():
                continue  # another process prepared it meanwhile
            raise
        entry = write_shard(partial, split, tokens, documents)
        finish_token_folder(partial, folder, [entry], "uint16",
                            {"kind": "bytes", "vocab_size": 256})
    return folders


def _gpt_config(model: GPTModelConfig, sequence_length: int, max_bytes: int, batch_size: int,
                trainer: TrainerConfig, runtime: RuntimeConfig) -> ExperimentConfig:
    task = GPTTaskConfig(model=model, sequence_length=sequence_length, max_bytes=max_bytes)
    return language_model_config(task, batch_size, trainer, runtime)


def _optimization(learning_rate: float, warmup_steps: int) -> OptimizationConfig:
    """GPT-2's recipe as nanoGPT runs it: AdamW (0.9, 0.95), weight decay 0.1, clipping at 1,
    warmup then cosine decay to a tenth."""
    return OptimizationConfig(
        optimizer=OptimizerConfig(name="adamw", learning_rate=learning_rate, weight_decay=0.1,
                                  betas=[0.9, 0.95]),
        learning_rate=LearningRateConfig(schedule="cosine", warmup_steps=warmup_steps,
                                         end_factor=0.1),
        gradient_clip_norm=1.0,
    )


@register_experiment("gpt")
def gpt_experiment() -> ExperimentConfig:
    """GPT-2-style decoder (tied head) on the stdlib's bytes; small, for a CPU."""
    return _gpt_config(
        GPTModelConfig(), sequence_length=128, max_bytes=2_000_000, batch_size=32,
        trainer=TrainerConfig(
            train_steps=2000, steps_per_loop=50, checkpoint_interval=500, validation_steps=20,
            validation_interval=500, best_checkpoint_eval_metric="bits_per_char",
            best_checkpoint_metric_comp="lower",
            optimizer_config=_optimization(learning_rate=1e-3, warmup_steps=100),
        ),
        runtime=RuntimeConfig(seed=0),
    )


@register_experiment("gpt2_small")
def gpt2_small_experiment() -> ExperimentConfig:
    """GPT-2 small (124M parameters) on the stdlib's bytes; for a GPU (bf16, compiled)."""
    return _gpt_config(
        GPTModelConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768),
        sequence_length=1024, max_bytes=20_000_000, batch_size=16,
        trainer=TrainerConfig(
            train_steps=5000, steps_per_loop=100, checkpoint_interval=1000,
            validation_steps=50, validation_interval=1000,
            best_checkpoint_eval_metric="bits_per_char", best_checkpoint_metric_comp="lower",
            compile_blocks=True,
            optimizer_config=_optimization(learning_rate=6e-4, warmup_steps=200),
        ),
        runtime=RuntimeConfig(device="auto", mixed_precision="bf16", seed=0),
    )
