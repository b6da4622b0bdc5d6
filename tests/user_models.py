"""Models users already have -- transformers' and timm's -- built from their configs (nothing is
downloaded), trained by cadence as their users write them: batches that are dicts of
``input_ids``, ``attention_mask`` and ``labels``, outputs that are a transformers
``ModelOutput`` (its loss computed by the model), images and labels for timm's classifiers.

- The experiments ``hub_llama``, ``hub_t5``, ``hub_vit`` and ``hub_convnext`` (a `cadence.Task`:
  `HubTask`) -- importing this module registers them.
- `HubRunner`: the same models as the model of a `cadence.StandardTrainer` of one's own,
  parallelized with `cadence.prepare_model`, its best weights exported by a
  `BestCheckpointExporter`; `train_runner` drives it with a `Controller`.

transformers and timm are imported when a model is built, not with this module, so that a job
importing it runs without them. `import_timm` makes timm importable beside a torchvision whose
C++ operators do not load (see its docstring).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

import cadence
from cadence.task.config import Config, DataConfig, TaskConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: models come from configs
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TEXT = ("llama", "llama_untied", "t5")
IMAGES = ("vit", "convnext")

_torchvision_ops: Any = None


def declare_torchvision_ops() -> None:
    """Lets ``import torchvision`` finish where its C++ operators cannot load.

    timm imports torchvision (and transformers does, when it is installed), and torchvision's
    wheels on PyPI for Linux are CUDA builds: beside a CPU-only torch their operators do not
    load, and ``import torchvision`` then fails ("operator torchvision::nms does not exist", from
    registering a meta kernel for an operator never declared). Declaring the two operators it
    registers that way (without any kernel) lets the import finish; these models use none of
    torchvision's operators.
    """
    global _torchvision_ops
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None or _torchvision_ops is not None:
        return
    try:
        torch.ops.load_library(str(Path(spec.origin).parent / "_C.so"))
        _torchvision_ops = True
    except OSError:
        _torchvision_ops = torch.library.Library("torchvision", "FRAGMENT")
        for name in ("nms", "qnms"):
            _torchvision_ops.define(
                f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def import_timm() -> Any:
    """``import timm`` (see `declare_torchvision_ops`)."""
    declare_torchvision_ops()
    import timm

    return timm


def import_transformers() -> Any:
    """``import transformers`` (see `declare_torchvision_ops`)."""
    declare_torchvision_ops()
    import transformers

    return transformers


@dataclass
class HubModelConfig(Config):
    """A tiny model of one of the libraries.

    Attributes:
        family: ``llama`` (tied embedding and head), ``llama_untied``, ``t5`` (an
            encoder-decoder), ``vit`` or ``convnext``.
        layers: the decoder's layers, the encoder's and decoder's blocks, the ViT's blocks, or
            the blocks of each ConvNeXt stage.
        width: the hidden size (a ConvNeXt's last stage).
    """

    family: str = "llama"
    layers: int = 2
    width: int = 32


@dataclass
class HubTaskConfig(TaskConfig):
    """A tiny learnable problem for the model: text whose next token follows from the last
    (``llama``), reversal of a sequence (``t5``), or images whose class shifts their mean."""

    model: HubModelConfig = field(default_factory=HubModelConfig)
    sequence_length: int = 12
    vocabulary: int = 64
    examples: int = 48


def build_hub_model(config: HubModelConfig, vocabulary: int = 64) -> nn.Module:
    """The model of `config`, from its library's config class (random weights)."""
    family, layers, width = config.family, config.layers, config.width
    declare_torchvision_ops()
    if family in ("llama", "llama_untied"):
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(
            vocab_size=vocabulary, hidden_size=width, intermediate_size=2 * width,
            num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
            max_position_embeddings=64, tie_word_embeddings=family == "llama", use_cache=False))
    if family == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        return T5ForConditionalGeneration(T5Config(
            vocab_size=vocabulary, d_model=width, d_kv=width // 2, d_ff=2 * width,
            num_layers=layers, num_heads=2, decoder_start_token_id=0, pad_token_id=0,
            use_cache=False))
    if family == "vit":
        return import_timm().create_model(
            "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=4,
            depth=layers, embed_dim=width, num_heads=2)
    if family == "convnext":
        return import_timm().create_model(
            "convnext_atto", pretrained=False, num_classes=4, depths=(layers,) * 4,
            dims=(width // 8, width // 4, width // 2, width))
    raise cadence.ConfigError(f"task.model.family (got {family!r}) must be one of "
                              f"{', '.join(TEXT + IMAGES)}.")


class Tokens(Dataset):
    """Token sequences as transformers users batch them: dicts of ``input_ids``,
    ``attention_mask`` and ``labels``. Causal: each sequence counts up from its first token;
    sequence to sequence: the labels are the input reversed."""

    def __init__(self, config: HubTaskConfig, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        length, vocabulary = config.sequence_length, config.vocabulary
        starts = torch.randint(1, vocabulary, (config.examples, 1), generator=generator)
        if config.model.family == "t5":
            self.ids = torch.randint(1, vocabulary, (config.examples, length),
                                     generator=generator)
            self.labels = self.ids.flip(1)
        else:
            self.ids = (starts + torch.arange(length)) % (vocabulary - 1) + 1
            self.labels = self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "attention_mask": torch.ones_like(self.ids[index]),
                "labels": self.labels[index]}


class Images(Dataset):
    """32x32 images whose class (of 4) shifts their mean, and the class."""

    def __init__(self, examples: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (examples,), generator=generator)
        noise = torch.randn(examples, 3, 32, 32, generator=generator)
        self.images = noise + self.labels.view(-1, 1, 1, 1).float() - 1.5

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]


def dataset(config: HubTaskConfig, training: bool) -> Dataset:
    seed = 0 if training else 1
    if config.model.family in IMAGES:
        return Images(config.examples, seed)
    return Tokens(config, seed)


@cadence.register_task(HubTaskConfig)
class HubTask(cadence.Task):
    """A transformers or timm model as the model of a Task: the default `Task.build_losses`
    takes a transformers model's own loss (its ``ModelOutput``'s ``loss``); an image
    classifier's is the cross-entropy of its logits."""

    def build_model(self) -> nn.Module:
        return build_hub_model(self.task_config.model, self.task_config.vocabulary)

    def build_inputs(self, params: DataConfig, input_context: Any = None) -> Any:
        return cadence.build_dataloader(dataset(self.task_config, params.is_training), params,
                                        input_context)

    def build_losses(self, labels: Any, model_outputs: Any, aux_losses: Any = None) -> Any:
        if self.task_config.model.family in IMAGES:
            return nn.functional.cross_entropy(model_outputs, labels)
        return super().build_losses(labels, model_outputs, aux_losses)

    def build_metrics(self, training: bool = True) -> dict[str, Any]:
        if self.task_config.model.family in IMAGES:
            return {"accuracy": cadence.Accuracy()}
        return {}


def hub_experiment(family: str) -> cadence.ExperimentConfig:
    """A few steps of `family`'s model: evaluated, checkpointed and its best exported every 2
    steps."""
    task = HubTaskConfig(model=HubModelConfig(family=family),
                         train_data=DataConfig(global_batch_size=8, is_training=True),
                         validation_data=DataConfig(global_batch_size=8, is_training=False))
    trainer = cadence.TrainerConfig(
        train_steps=4, steps_per_loop=2, checkpoint_interval=2, validation_interval=2,
        validation_steps=2, best_checkpoint_eval_metric="validation_loss",
        best_checkpoint_metric_comp="lower")
    trainer.optimizer_config.optimizer.name = "adamw"
    trainer.optimizer_config.optimizer.learning_rate = 3e-3
    return cadence.ExperimentConfig(task=task, trainer=trainer,
                                    runtime=cadence.RuntimeConfig(device="cpu", seed=0))


for _family in (*TEXT, *IMAGES):
    cadence.register_experiment(f"hub_{_family}")(
        lambda family=_family: hub_experiment(family))


# ---------------------------------------------------------------------------- a StandardTrainer


class HubRunner(cadence.StandardTrainer, cadence.StandardEvaluator):
    """A transformers or timm model in a runner of one's own (Orbit's way): the runner calls the
    model, takes its loss and steps its optimizer; `cadence.prepare_model` spreads it over the
    ranks as `strategy` says; `BestCheckpointExporter` keeps its best weights."""

    _TRACKING_IGNORED = frozenset({"trained"})  # the wrapper: checkpoints hold the model

    def __init__(self, family: str, strategy: str, export_dir: Path,
                 options: cadence.ParallelOptions | None = None) -> None:
        config = hub_experiment(family).task
        torch.manual_seed(0)
        self.family = family
        self.model = build_hub_model(config.model, config.vocabulary)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
        self.trained = cadence.prepare_model(self.model, strategy, torch.device("cpu"),
                                             optimizers=[self.optimizer], options=options)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        context = cadence.InputContext(world, int(os.environ.get("RANK", "0")), world)
        train = cadence.build_dataloader(dataset(config, True), config.train_data, context)
        evaluation = cadence.build_dataloader(dataset(config, False), config.validation_data,
                                              context)
        cadence.StandardTrainer.__init__(self, train)
        cadence.StandardEvaluator.__init__(self, evaluation)
        self.train_loss = cadence.Mean()
        self.eval_loss = cadence.Mean()
        self.exporter = cadence.BestCheckpointExporter(export_dir, "loss", "lower")

    def loss(self, batch: Any) -> torch.Tensor:
        if self.family in IMAGES:
            images, labels = batch
            return nn.functional.cross_entropy(self.trained(images), labels)
        return self.trained(**batch).loss  # a transformers model computes its own

    def train_loop_begin(self) -> None:
        self.trained.train()
        self.train_loss.reset()

    def train_step(self, iterator: Iterator[Any]) -> None:
        loss = self.loss(next(iterator))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.train_loss.update(loss.detach())

    def train_loop_end(self) -> cadence.Output:
        self.train_loss.all_reduce()
        return {"loss": self.train_loss.result()}

    def eval_begin(self) -> None:
        self.trained.eval()
        self.eval_loss.reset()

    def eval_step(self, iterator: Iterator[Any]) -> None:
        with torch.no_grad():
            self.eval_loss.update(self.loss(next(iterator)))

    def eval_end(self) -> cadence.Output:
        self.eval_loss.all_reduce()
        logs = {"loss": float(self.eval_loss.result())}
        # Every rank: an FSDP2 model's weights are gathered from every rank's shards.
        self.exporter.maybe_export_checkpoint(self.trained, logs, self.global_step)
        return logs


def train_runner(family: str, strategy: str, run_dir: Path, steps: int = 4,
                 eval_interval: int = 2,
                 options: cadence.ParallelOptions | None = None) -> HubRunner:
    """Trains a `HubRunner` for `steps`, evaluating every `eval_interval` steps; returns it.
    Under torchrun, the process joins the job first (as a script of one's own does)."""
    from cadence.engine.runtime import init_distributed

    init_distributed(device=torch.device("cpu"))
    runner = HubRunner(family, strategy, run_dir / "best", options)
    controller = cadence.Controller(
        trainer=runner, evaluator=runner, steps_per_loop=2,
        checkpoint_manager=cadence.CheckpointManager(runner, run_dir / "checkpoints",
                                                     checkpoint_interval=2))
    controller.train_and_evaluate(train_steps=steps, eval_steps=2, eval_interval=eval_interval)
    controller.close()
    return runner
