"""Pipeline stages: a model split along its layer stack into parts that keep its own names.

**Where a model is split.** By default evenly over its repeated blocks (the children of the one
``nn.ModuleList`` of one class that `cadence.engine.parallelize.find_repeated_blocks` finds: a
transformer's layers) -- the first stages take one block more where they do not divide evenly
--, the modules registered before the blocks (the embeddings) with the first stage, those
registered after them (the final norm, the head) with the last; modules without parameters
(dropout, rotary embeddings) run on every stage. Or as a user says: a list of module names per
stage (``runtime.parallelism.pp_stage_modules``; torchtitan's ``module_fqns_per_model_part``),
in the order the forward runs them.

**Each stage is a part that keeps the model's parameter names** (torchtitan's way, which
checkpoints need to move between layouts): a deep copy of the whole model in which every module
the stage does not hold is replaced by a placeholder that holds nothing -- a block before the
stage's passes its input through, a block or module after it ends the stage (its input is the
stage's output), a module before it (an embedding) refuses to run. ``blocks.2`` of a stage is
``blocks.2`` of the model.

**How a stage runs.** The model's own forward, on every stage, with the microbatch's features
(every stage of a data shard reads the same batch); a stage after the first gives the model the
previous stage's hidden state as ``inputs_embeds`` -- transformers' keyword for "skip the
embeddings", which every transformers decoder takes, and the ``gpt`` experiment's model too --
in place of the inputs. A model whose forward takes no ``inputs_embeds`` cannot be split by
cadence: `check_splittable` says so in one line.

**Tied parameters.** A parameter two stages use -- the ``gpt`` experiment's token embedding,
which is also its output head's weight, on the first and the last stage -- is held by each of
them, under the model's own name, and its gradients are summed between them before the update
(`Pipeline.sum_shared_gradients`), as Megatron-LM's embedding group does: both copies start
equal and stay equal. The copy on the later stage is not counted again in the gradient norm
and the model summary.
"""

from __future__ import annotations

import copy
import inspect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cadence.core.errors import ConfigError
from cadence.engine.placeholders import StagePlaceholder, is_placeholder

# ---------------------------------------------------------------------------- placeholders


class StageOutput(Exception):
    """Raised by the first module after a stage's last one: its input is the stage's output."""

    def __init__(self, hidden: Any) -> None:
        super().__init__("the end of a pipeline stage")
        self.hidden = hidden


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values()), None))


class SkippedBlock(StagePlaceholder):
    """A block of an earlier stage: passes its input (the hidden state) through."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _hidden(args, kwargs)


class StageEnd(StagePlaceholder):
    """A block or module of a later stage: the stage ends here, its input is its output."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise StageOutput(_hidden(args, kwargs))


class NotOnStage(StagePlaceholder):
    """A module of an earlier stage that is not a block (an embedding): never to be called,
    since a later stage is given the hidden state as ``inputs_embeds``."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self.replaced} was called on pipeline stage {self.stage}, which does not hold it: "
            "a stage after the first calls the model with inputs_embeds= the previous stage's "
            "hidden state, and the model's forward must then skip its embeddings. Give the "
            "model's forward an inputs_embeds argument that does, or assign the stages' modules "
            "with runtime.parallelism.pp_stage_modules.")


# ---------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class StagePlan:
    """Which modules each stage holds.

    Attributes:
        stages: each stage's module names, in the order the forward runs them.
        blocks: the names of the children of the blocks' container (pass-through placeholders
            where a stage does not hold one), or none.
    """

    stages: tuple[tuple[str, ...], ...]
    blocks: frozenset[str] = frozenset()

    def owner(self) -> dict[str, int]:
        """Each planned module's stage."""
        return {name: index for index, names in enumerate(self.stages) for name in names}

    def describe(self) -> str:
        """The stages in words: ``stage 0: wte, wpe, blocks.0-1; stage 1: ...``."""
        from cadence.engine.parallelize import name_pattern

        return "; ".join(f"stage {index}: {name_pattern(names)}"
                         for index, names in enumerate(self.stages))


_HOW = ("give the stages' modules with runtime.parallelism.pp_stage_modules (a list of module "
        "names per stage, in the order the forward runs them)")


def check_splittable(model: nn.Module) -> None:
    """Refuses, in one line, a model whose stages cannot run: its forward takes no
    ``inputs_embeds`` (where a later stage gives it the previous stage's hidden state).

    Raises:
        ConfigError: as just said.
    """
    if "inputs_embeds" not in _parameters(model):
        raise ConfigError(
            f"runtime.parallelism.pp > 1, and {type(model).__name__}.forward takes no "
            "inputs_embeds: a pipeline stage after the first calls the model with inputs_embeds= "
            "the previous stage's hidden state (as transformers' decoders take it). Give its "
            "forward an inputs_embeds argument that skips the embeddings, or train it with pp=1.")


def _parameters(model: nn.Module) -> list[str]:
    try:
        return list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return []


def plan_stages(model: nn.Module, stages: int,
                given: Sequence[Sequence[str]] | None = None) -> StagePlan:
    """Where `model` is split into `stages` stages (see the module docstring): `given`, a list
    of module names per stage, or evenly over the repeated blocks.

    Raises:
        ConfigError: for a model with no repeated blocks in one container (and no `given`),
            more stages than blocks, or a `given` split that names unknown modules, leaves a
            module with parameters out, names one twice, or has another number of stages.
    """
    from cadence.engine.parallelize import find_repeated_blocks

    found = find_repeated_blocks(model)
    containers = {name.rpartition(".")[0] for name in found.names}
    blocks = frozenset(found.names) if len(containers) == 1 else frozenset()
    if given:
        return _given_plan(model, stages, given, blocks)
    kind = type(model).__name__
    if not found.names or len(containers) != 1:
        where = (f"its repeated blocks are in {len(containers)} containers "
                 f"({', '.join(sorted(containers))})" if found.names else
                 "it has no repeated blocks (an nn.ModuleList of one class)")
        raise ConfigError(f"runtime.parallelism.pp={stages} cannot split {kind}: {where}; "
                          f"{_HOW}.")
    if stages > len(found.names):
        raise ConfigError(
            f"runtime.parallelism: {stages} pipeline stages (pp x pp_stages_per_rank) and "
            f"{kind} has {len(found.names)} blocks ({found.names[0]}...{found.names[-1]}): each "
            "stage needs one at least. Lower pp or pp_stages_per_rank.")
    container = containers.pop()
    before, after = _outside(model, container)
    sizes = [len(found.names) // stages + (index < len(found.names) % stages)
             for index in range(stages)]
    bounds = list(itertools.accumulate([0, *sizes]))
    plan = [list(found.names[bounds[index]:bounds[index + 1]]) for index in range(stages)]
    plan[0][:0] = before
    plan[-1].extend(after)
    return StagePlan(tuple(tuple(names) for names in plan), blocks)


def _outside(model: nn.Module, container: str) -> tuple[list[str], list[str]]:
    """The largest modules with parameters outside the blocks' container, registered before it
    and after it."""
    before: list[str] = []
    after: list[str] = []
    seen_container = False
    ancestors = {container.rsplit(".", depth)[0] for depth in range(container.count(".") + 1)}
    ancestors.add("")

    def walk(module: nn.Module, prefix: str) -> None:
        nonlocal seen_container
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if path == container:
                seen_container = True
            elif path in ancestors:
                walk(child, f"{path}.")
            elif any(True for _ in child.parameters()):
                (after if seen_container else before).append(path)

    walk(model, "")
    return before, after


def _given_plan(model: nn.Module, stages: int, given: Sequence[Sequence[str]],
                blocks: frozenset[str]) -> StagePlan:
    key = "runtime.parallelism.pp_stage_modules"
    if len(given) != stages:
        raise ConfigError(f"{key} gives {len(given)} stages and the job has {stages} (pp x "
                          "pp_stages_per_rank): give one list of module names per stage.")
    modules = dict(model.named_modules())
    named = [name for names in given for name in names]
    unknown = [name for name in named if name not in modules or not name]
    twice = sorted({name for name in named if named.count(name) > 1})
    nested = [name for name in named for other in named
              if other != name and name.startswith(f"{other}.")]
    empty = [index for index, names in enumerate(given) if not names]
    ancestors = {name.rsplit(".", depth)[0] for name in named for depth in
                 range(1, name.count(".") + 1)} | {""}
    # by every name of a parameter: a head whose weight is the embedding's, left out, would
    # stay on every stage holding a copy that no stage's gradients reach
    left = [name for name, _ in model.named_parameters(remove_duplicate=False)
            if not any(name.startswith(f"{module}.") for module in named)
            and name.rpartition(".")[0] not in ancestors]
    problems = ([f"unknown modules {unknown[:3]}"] if unknown else []) + (
        [f"modules named twice {twice[:3]}"] if twice else []) + (
        [f"modules inside others named {nested[:3]}"] if nested else []) + (
        [f"stages without a module {empty}"] if empty else []) + (
        [f"parameters in no stage {left[:3]}"] if left else [])
    if problems:
        raise ConfigError(f"{key} does not split {type(model).__name__}: "
                          + "; ".join(problems) + ".")
    return StagePlan(tuple(tuple(names) for names in given), blocks)


# ---------------------------------------------------------------------------- the parts


@dataclass
class StagePart:
    """One stage's part of the model.

    Attributes:
        index: the stage.
        module: the part: the model with what the stage does not hold replaced.
        shared: the names of its parameters that another stage holds too (tied), with the
            stages that hold each.
    """

    index: int
    module: nn.Module
    shared: dict[str, tuple[int, ...]]


def _ties(model: nn.Module) -> list[list[str]]:
    """The names of each parameter that several modules share, the model's own first."""
    seen: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        seen.setdefault(id(parameter), []).append(name)
    return [names for names in seen.values() if len(names) > 1]


def _planned_ancestor(name: str, owner: dict[str, int]) -> str | None:
    """The planned module that holds parameter or module `name`, or None (the root's)."""
    path = name.rpartition(".")[0]
    while path:
        if path in owner:
            return path
        path = path.rpartition(".")[0]
    return None


def _users(plan: StagePlan, names: list[str]) -> list[int]:
    """The stages whose modules hold one of `names` (a tied parameter's); a parameter of the
    model's root (or of an ancestor of the blocks) is the first stage's."""
    owner = plan.owner()
    found = set()
    for name in names:
        holder = _planned_ancestor(name, owner)
        found.add(owner[holder] if holder is not None else 0)
    return sorted(found)


def shared_parameters(model: nn.Module, plan: StagePlan) -> dict[str, tuple[int, ...]]:
    """Each tied parameter that several stages use, by the model's own name for it (the first
    of its names), with those stages."""
    shared = {}
    for names in _ties(model):
        users = _users(plan, names)
        if len(users) > 1:
            shared[names[0]] = tuple(users)
    return shared


def stage_part(model: nn.Module, plan: StagePlan, index: int) -> StagePart:
    """Stage `index`'s part of `model`: a deep copy in which each module that the stage does
    not hold is a placeholder, but the owner of a tied parameter the stage uses, which it keeps
    (see the module docstring).

    Raises:
        ConfigError: when the stage uses a tied parameter whose owner holds other parameters
            too (it would hold them twice).
    """
    owner = plan.owner()
    shared = {name: users for name, users in shared_parameters(model, plan).items()
              if index in users}
    tied = {id(model.get_parameter(names[0])) for names in _ties(model)}
    keep: set[str] = set()
    for canonical in shared:
        holder = _planned_ancestor(canonical, owner)
        if holder is None or owner[holder] == index:
            continue
        if any(id(p) not in tied for p in model.get_submodule(holder).parameters()):
            raise ConfigError(
                f"runtime.parallelism.pp: stage {index} uses {canonical}, a parameter tied "
                f"to another module's, and {holder} holds other parameters too: put the "
                "modules that share it on one stage (pp_stage_modules).")
        keep.add(holder)
    part = copy.deepcopy(model)
    for name in sorted(owner, key=lambda n: (n.count("."), n)):
        stage = owner[name]
        if stage == index or name in keep:
            continue
        parent, _, attribute = name.rpartition(".")
        if stage > index:
            placeholder: StagePlaceholder = StageEnd(name, index)
        elif name in plan.blocks:
            placeholder = SkippedBlock(name, index)
        else:
            placeholder = NotOnStage(name, index)
        setattr(part.get_submodule(parent) if parent else part, attribute, placeholder)
    _drop_untied_root_parameters(part, plan, index)
    return StagePart(index, part, shared)


def _drop_untied_root_parameters(part: nn.Module, plan: StagePlan, index: int) -> None:
    """Parameters held by the model's root or the blocks' ancestors go with the first stage
    (they are used before the blocks, as a ViT's class token): the other stages drop them."""
    if index == 0:
        return
    owner = plan.owner()
    for name, module in list(part.named_modules()):
        if name in owner or is_placeholder(module):
            continue
        if any(name.startswith(f"{held}.") for held in owner):
            continue
        for attribute in list(module._parameters):
            module._parameters.pop(attribute)


# ---------------------------------------------------------------------------- running a stage

_TENSOR = object()
"""Where the last stage's outputs held a tensor."""


class StageModule(nn.Module):
    """One stage as ``torch.distributed.pipelining`` runs it: the part called with the
    microbatch's features (every stage gets them) and -- after the first stage -- the previous
    stage's output as ``inputs_embeds`` in place of the inputs. A stage before the last returns
    its hidden state; the last returns the tensors of the model's outputs (pipelining takes
    tensors alone), which `outputs` makes the model's outputs again, for the loss.

    Args:
        part: the stage's part (`stage_part`).
        first: whether it is the first stage.
        last: whether it is the last stage.
        autocast: the dtype of the forward's autocast, or None.
    """

    def __init__(self, part: nn.Module, first: bool, last: bool,
                 autocast: torch.dtype | None = None) -> None:
        super().__init__()
        self.part = part
        self.first = first
        self.last = last
        self.autocast = autocast
        self._inputs = next(iter(_parameters(part)), "input_ids")
        """The name of the model's first argument (``input_ids``), which ``inputs_embeds``
        replaces after the first stage."""
        self._device_type = next((p.device.type for p in part.parameters()), "cpu")
        self._structure: Any = None
        """The last stage's outputs without their tensors: `outputs` puts them back."""

    def feature_arguments(self, features: Any) -> dict[str, Any]:
        """The keyword arguments of the part for a microbatch's features: a mapping's keys (a
        transformers batch), or a tensor as the model's first argument.

        Raises:
            TypeError: for features of another kind.
        """
        if isinstance(features, torch.Tensor):
            return {self._inputs: features}
        if isinstance(features, dict) and all(isinstance(key, str) for key in features):
            return dict(features)
        raise TypeError(
            f"A pipeline stage takes a batch's features as a tensor or a dict of the model's "
            f"keyword arguments (got {type(features).__name__}): return one of them from the "
            "Task's data.")

    def forward(self, *received: torch.Tensor, **features: Any) -> Any:
        if not self.first:
            features.pop(self._inputs, None)
            features["inputs_embeds"] = received[0]
        try:
            if self.autocast is None:
                out = self.part(**features)
            else:
                with torch.autocast(self._device_type, dtype=self.autocast):
                    out = self.part(**features)
        except StageOutput as end:
            return end.hidden
        if not self.last or isinstance(out, torch.Tensor):
            return out
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten(out)
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        self._structure = (spec, [_TENSOR if isinstance(leaf, torch.Tensor) else leaf
                                  for leaf in leaves])
        return tuple(tensors)

    def outputs(self, returned: Any) -> Any:
        """The model's outputs (a transformers ``ModelOutput``, a dict, a tensor) from what the
        last stage returned."""
        if self._structure is None:
            return returned
        from torch.utils._pytree import tree_unflatten

        spec, constants = self._structure
        tensors = iter(returned if isinstance(returned, tuple) else (returned,))
        return tree_unflatten([next(tensors) if leaf is _TENSOR else leaf
                               for leaf in constants], spec)
