"""Tensor parallelism: each layer's matrices split across the ``tp`` ranks of a mesh.

A **plan** maps module-name patterns (``fnmatch``: ``blocks.*.attn.q_proj``) to torch's parallel
styles -- ``ColwiseParallel`` (a Linear's output features split: its input is the whole
activation, its output a slice), ``RowwiseParallel`` (its input features split: the slices'
products are summed across the ranks into the whole output), ``SequenceParallel`` and the rest
of ``torch.distributed.tensor.parallel`` -- which `apply_tensor_parallel` gives to
``parallelize_module`` over the mesh's ``tp`` dimension. The classic pairing (Megatron-LM's) is
attention's query, key and value column-wise and its output row-wise, the MLP's first layer(s)
column-wise and its last row-wise: one all-reduce per pair, in forward and in backward.

Where a plan comes from (`tensor_parallel_plan`), first that applies:

1. the one given (a Task's own ``parallelize`` passes it to `cadence.parallelize_model`);
2. the model's own: a ``tensor_parallel_plan()`` method (cadence's ``gpt`` has one);
3. a transformers model's, from what its config declares (``config.base_model_tp_plan``:
   Llama, Mistral, Qwen2, Gemma, ... -- ``colwise``/``rowwise`` by module path), with its token
   embedding split by rows (vocabulary) and its head by columns, as torchtitan splits Llama's;
4. else one line saying how to give one.

Every rank of a tensor-parallel group computes the replicated parts (norms, the residual
stream) alike, on the same batch: the data coordinate (`cadence.engine.runtime`) gives them one.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from torch import nn

from cadence.core.errors import ConfigError
from cadence.engine.placeholders import is_placeholder

HEAD_COUNTS = ("num_attention_heads", "num_key_value_heads", "n_head")
"""The config fields of a model's attention heads that tensor parallelism splits: each must be
a multiple of the degree (a rank holds whole heads)."""


def tensor_parallel_plan(model: nn.Module, given: Mapping[str, Any] | None = None
                         ) -> dict[str, Any]:
    """The plan for `model` (see the module docstring for where it comes from).

    Raises:
        ConfigError: when `model` has none, saying how to give one.
    """
    if given is not None:
        return dict(given)
    own = getattr(model, "tensor_parallel_plan", None)
    if callable(own):
        return dict(own())
    declared = _transformers_plan(model)
    if declared is not None:
        return declared
    raise ConfigError(
        f"runtime.parallelism.tp > 1, and {type(model).__name__} has no tensor-parallel plan: "
        "give it a tensor_parallel_plan() method that returns {module-name pattern: "
        "ColwiseParallel() / RowwiseParallel() / ...} (torch.distributed.tensor.parallel), or "
        "override Task.parallelize and pass tp_plan=... to cadence.parallelize_model "
        "(docs/parallelism.md shows both).")


def _transformers_plan(model: nn.Module) -> dict[str, Any] | None:
    """A transformers model's plan from its config's ``base_model_tp_plan`` (its decoder's
    linears by path), its base model's path prefixed, plus its token embedding (split by rows:
    vocabulary) and its output head (by columns), both with whole outputs; None when the model
    declares none."""
    config = getattr(model, "config", None)
    declared = getattr(config, "base_model_tp_plan", None)
    if not declared:
        return None
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else None
    prefix = f"{prefix}." if isinstance(base, nn.Module) and base is not model else ""
    plan: dict[str, Any] = {}
    for pattern, style in declared.items():
        if style not in styles:
            return None  # a layout of its own (packed experts, ...): not one torch's styles take
        plan[prefix + pattern] = styles[style]()
    names = {id(module): name for name, module in model.named_modules()}
    embedding = _called(model, "get_input_embeddings")
    if isinstance(embedding, nn.Embedding) and id(embedding) in names:
        plan[names[id(embedding)]] = RowwiseParallel(input_layouts=Replicate(),
                                                     output_layouts=Replicate())
    head = _called(model, "get_output_embeddings")
    if isinstance(head, nn.Linear) and id(head) in names:
        plan[names[id(head)]] = ColwiseParallel(output_layouts=Replicate())
    return plan


def _called(model: nn.Module, method: str) -> Any:
    """``model.<method>()`` where the model has that method (transformers'), else None."""
    found = getattr(model, method, None)
    return found() if callable(found) else None


def plan_problems(model: nn.Module, plan: Mapping[str, Any], degree: int) -> list[str]:
    """What stops `plan` from splitting `model` `degree` ways, one phrase each: a pattern that
    matches no module, a Linear or Embedding whose split dimension is not a multiple of the
    degree, a head count (`HEAD_COUNTS`) that is not one."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    problems: list[str] = []
    modules = dict(model.named_modules())
    for pattern, style in plan.items():
        matched = [name for name in modules if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            problems.append(f"the plan's {pattern!r} matches no module of "
                            f"{type(model).__name__}")
            continue
        for name in matched:
            module = modules[name]
            size = _split_size(module, style, ColwiseParallel, RowwiseParallel)
            if size is not None and size % degree:
                problems.append(f"{name} ({type(module).__name__}) splits {size} "
                                f"{'rows' if isinstance(module, nn.Embedding) else 'features'}, "
                                f"not a multiple of tp={degree}")
    for holder in {id(m): m for m in modules.values() if hasattr(m, "config")}.values():
        config = holder.config
        for field in HEAD_COUNTS:
            count = getattr(config, field, None)
            if isinstance(count, int) and count % degree:
                problems.append(f"{type(holder).__name__}'s {field}={count} is not a multiple "
                                f"of tp={degree} (a rank holds whole heads)")
    return sorted(set(problems), key=problems.index)


def _split_size(module: nn.Module, style: Any, colwise: type, rowwise: type) -> int | None:
    """How many features (or embedding rows) `style` splits in `module`; None where unknown."""
    if isinstance(module, nn.Linear):
        if isinstance(style, colwise):
            return module.out_features
        if isinstance(style, rowwise):
            return module.in_features
    if isinstance(module, nn.Embedding):
        if isinstance(style, rowwise):
            return module.num_embeddings
        if isinstance(style, colwise):
            return module.embedding_dim
    return None


def held_plan(model: nn.Module, plan: Mapping[str, Any]) -> dict[str, Any]:
    """`plan` for a pipeline stage's part (`cadence.engine.pipeline_stages`): each pattern
    made the names of the modules it matches that the stage holds, as torch's
    ``parallelize_module`` matches them (each dotted part by ``fnmatch``); `plan` itself for a
    model that is not a part. A stage splits what it holds."""
    modules = dict(model.named_modules())
    if not any(is_placeholder(module) for module in modules.values()):
        return dict(plan)
    held = {name for name in modules if not any(
        is_placeholder(modules[name.rsplit(".", depth)[0]])
        for depth in range(name.count(".") + 1))}
    kept: dict[str, Any] = {}
    for pattern, style in plan.items():
        parts = pattern.split(".")
        matched = [name for name in modules if len(name.split(".")) == len(parts) and all(
            fnmatch.fnmatchcase(token, part) for token, part in zip(name.split("."), parts))]
        if not matched:
            kept[pattern] = style  # matches nothing: `plan_problems` says so
        kept.update((name, style) for name in matched if name in held)
    return kept


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, plan: Mapping[str, Any]) -> None:
    """Splits `model` in place over `tp_mesh` by `plan` (``parallelize_module``): its split
    parameters become DTensors, their names unchanged. A parameter two modules share (a tied
    embedding and head) is split once, as the first module's style says, and stays shared.

    Raises:
        ConfigError: when the plan cannot split the model that many ways (`plan_problems`),
            before any parameter changes.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    degree = tp_mesh.size()
    plan = held_plan(model, plan)
    problems = plan_problems(model, plan, degree)
    if problems:
        raise ConfigError(f"runtime.parallelism.tp={degree}: " + "; ".join(problems) + ".")
    ties = _ties(model)
    parallelize_module(model, tp_mesh, dict(plan))
    for names in ties:
        _retie(model, names)


def _ties(model: nn.Module) -> list[list[str]]:
    """The names of each parameter that several modules share (``remove_duplicate=False``)."""
    seen: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        seen.setdefault(id(parameter), []).append(name)
    return [names for names in seen.values() if len(names) > 1]


def _retie(model: nn.Module, names: list[str]) -> None:
    """Makes every name of a once-tied parameter the first name's (split) parameter again: a
    style that distributes a module's weight replaces it in that module only."""
    first = model.get_parameter(names[0])
    for name in names[1:]:
        owner, _, attribute = name.rpartition(".")
        module = model.get_submodule(owner) if owner else model
        if getattr(module, attribute) is not first:
            setattr(module, attribute, first)
