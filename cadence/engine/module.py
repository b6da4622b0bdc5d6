"""`Module`: the ``tf.Module`` contract (seed 000) on PyTorch.

A `Module` has a name, a name scope, and finds its submodules and variables by walking its
attributes on demand -- nothing is registered, nothing intercepts ``__setattr__``:

>>> import torch
>>> a, b, c = Module(name="a"), Module(name="b"), Module(name="c")
>>> a.b = b
>>> b.c = c
>>> list(a.submodules) == [b, c], list(b.submodules) == [c], list(c.submodules) == []
(True, True, True)
>>> b.w = torch.nn.Linear(2, 3)
>>> [tuple(v.shape) for v in a.trainable_variables]
[(3, 2), (3,)]

Submodules are `cadence.Module` and ``nn.Module`` objects reachable through attributes (also
inside lists, tuples and dicts), depth first, each once. Variables are the tensors they own --
parameters, buffers, plain tensor attributes and optimizer state -- each once, in that order.

A Module is also what a `CheckpointManager` saves, and what that means is declared, not found:
`checkpoint_items` names the stateful parts a checkpoint holds. By default they are the public
attributes that have ``state_dict``/``load_state_dict`` (models, optimizers, schedulers,
scalers, metrics -- torchmetrics' too, with their states: see `cadence.engine.external_metrics`
-- ...), and the parts of public attributes that are themselves Modules; private
attributes (a leading ``_``) are saved only where a class declares them -- a runner declares its
step counter and data position. Seed 000's discovery (`submodules`, `variables`) is a separate
contract and walks everything.

>>> holder = Module()
>>> holder.net = torch.nn.Linear(2, 1)
>>> holder._scratch = torch.nn.Linear(2, 1)   # private: not part of a checkpoint
>>> sorted(holder.checkpoint_items())
['net']
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch import nn

from cadence.core.errors import CheckpointMismatchError
from cadence.core.protocols import is_stateful
from cadence.core.scope import push_scope
from cadence.engine.external_metrics import checkpoint_part

F = TypeVar("F", bound=Callable[..., Any])

_VALID_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_CONTAINERS = (list, tuple, dict, set, frozenset)


def camel_to_snake(name: str) -> str:
    """``"MyTrainer"`` -> ``"my_trainer"``."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def _leaves(value: Any) -> Iterator[Any]:
    """The non-container values inside nested lists, tuples, dicts and sets."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, _CONTAINERS):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _named_leaves(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _named_leaves(f"{prefix}.{key}", item)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _named_leaves(f"{prefix}.{index}", item)
    else:
        yield prefix, value


def _attributes(obj: Any) -> Iterator[tuple[str, Any]]:
    """The attributes walked for discovery: a Module's own, sorted by name (as ``tf.Module``);
    an ``nn.Module``'s children in registration order, then its public plain attributes."""
    if isinstance(obj, Module):
        ignored = _ignored_attributes(type(obj))  # type: ignore[arg-type]
        for name, value in sorted(vars(obj).items()):
            if name not in ignored:
                yield name, value
    if isinstance(obj, nn.Module):
        yield from obj._modules.items()
        for name, value in vars(obj).items():
            if not name.startswith("_") and not isinstance(obj, Module):
                yield name, value


@functools.cache
def _ignored_attributes(cls: type) -> frozenset[str]:
    """The union of `_TRACKING_IGNORED` over the class hierarchy: attributes that hold data or
    bookkeeping rather than submodules and variables."""
    ignored: frozenset[str] = frozenset()
    for klass in cls.__mro__:
        ignored |= vars(klass).get("_TRACKING_IGNORED", frozenset())
    return ignored


class NameScope:
    """The context manager returned by `Module.name_scope`.

    Inside it, summary tags get the scope's path as prefix, and when the torch profiler is on,
    the block is recorded as a range named after the path, so traces show the module structure.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._stack: list[Any] = []

    def __enter__(self) -> str:
        scope = push_scope(self.name)
        path = scope.__enter__()
        record = None
        if torch.autograd.profiler._is_profiler_enabled:
            record = torch.profiler.record_function(path)
            record.__enter__()
        self._stack.append((scope, record))
        return path

    def __exit__(self, *exc: Any) -> None:
        scope, record = self._stack.pop()
        if record is not None:
            record.__exit__(*exc)
        scope.__exit__(*exc)


class Module:
    """A named container of submodules and variables, found on demand.

    Args:
        name: the module's name; defaults to the class name in snake_case.

    Raises:
        ValueError: if `name` is not a valid name (letters, digits, ``_``, ``.``, ``-``;
            not starting with a digit).
    """

    _TRACKING_IGNORED: frozenset[str] = frozenset({"_name"})
    """Attribute names that tracking skips; subclasses add theirs (the sets are merged)."""

    def __init__(self, name: str | None = None) -> None:
        if name is not None and (not isinstance(name, str) or not _VALID_NAME.match(name)):
            raise ValueError(
                f"`name` (got {name!r}) must be a valid module name: letters, digits, '_', '.', "
                "'-', not starting with a digit. Pass e.g. name='my_trainer'."
            )
        self._name = name

    @property
    def name(self) -> str:
        """The name given to the constructor, or the class name in snake_case."""
        return getattr(self, "_name", None) or camel_to_snake(type(self).__name__)

    @property
    def name_scope(self) -> NameScope:
        """A context manager that enters this module's name scope (nested inside the current)."""
        return NameScope(self.name)

    @staticmethod
    def with_name_scope(method: F) -> F:
        """Decorator: runs `method` inside ``self.name_scope``."""

        @functools.wraps(method)
        def wrapper(self: Module, *args: Any, **kwargs: Any) -> Any:
            with self.name_scope:
                return method(self, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    # ------------------------------------------------------------------ tracking

    @property
    def submodules(self) -> tuple[Module | nn.Module, ...]:
        """All `Module` and ``nn.Module`` objects reachable from here, depth first, each once."""
        seen = {id(self)}
        found: list[Module | nn.Module] = []

        def visit(obj: Any) -> None:
            for _, value in _attributes(obj):
                for leaf in _leaves(value):
                    if isinstance(leaf, (Module, nn.Module)) and id(leaf) not in seen:
                        seen.add(id(leaf))
                        found.append(leaf)
                        visit(leaf)

        visit(self)
        return tuple(found)

    @property
    def variables(self) -> tuple[torch.Tensor, ...]:
        """Tensors owned by this module and its submodules, each once: parameters, buffers,
        plain tensor attributes, then the state of reachable optimizers."""
        seen: set[int] = set()
        found: list[torch.Tensor] = []

        def add(tensor: Any) -> None:
            if isinstance(tensor, torch.Tensor) and id(tensor) not in seen:
                seen.add(id(tensor))
                found.append(tensor)

        optimizers: list[torch.optim.Optimizer] = []
        for module in (self, *self.submodules):
            if isinstance(module, nn.Module):
                for param in module.parameters(recurse=False):
                    add(param)
                for buffer in module.buffers(recurse=False):
                    add(buffer)
            for _, value in _attributes(module):
                for leaf in _leaves(value):
                    add(leaf)
                    if isinstance(leaf, torch.optim.Optimizer) and leaf not in optimizers:
                        optimizers.append(leaf)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                for param in group["params"]:
                    for _, value in sorted(optimizer.state.get(param, {}).items()):
                        add(value)
        return tuple(found)

    @property
    def trainable_variables(self) -> tuple[torch.Tensor, ...]:
        """The `variables` that require gradients."""
        return tuple(v for v in self.variables if v.requires_grad)

    @property
    def non_trainable_variables(self) -> tuple[torch.Tensor, ...]:
        """The `variables` that do not require gradients."""
        return tuple(v for v in self.variables if not v.requires_grad)

    # ------------------------------------------------------------------ state

    def checkpoint_items(self) -> dict[str, Any]:
        """The named stateful parts a checkpoint of this module holds, by attribute path.

        The default declares every public attribute with ``state_dict``/``load_state_dict`` --
        inside lists, tuples and dicts too (``"optimizers.0"``) -- and the `checkpoint_items` of
        public attributes that are `cadence.Module` (``"task.model"``). Private attributes are
        not saved: override this method to declare more (``{**super().checkpoint_items(),
        "ema": self._ema}``) or fewer parts. An object reachable twice is saved once, under its
        first path.
        """
        found: dict[str, Any] = {}
        seen: set[int] = {id(self)}
        for name, value in sorted(vars(self).items()):
            if name.startswith("_"):
                continue
            for path, leaf in _named_leaves(name, value):
                if id(leaf) in seen:
                    continue
                seen.add(id(leaf))
                if isinstance(leaf, Module):
                    for inner, obj in leaf.checkpoint_items().items():
                        if id(obj) not in seen:
                            seen.add(id(obj))
                            found[f"{path}.{inner}"] = obj
                elif is_stateful(leaf):
                    found[path] = checkpoint_part(leaf)  # a torchmetrics metric: its states
        return found

    def state_dict(self) -> dict[str, Any]:
        """The state of every part in `checkpoint_items`, by path."""
        return {path: obj.state_dict() for path, obj in self.checkpoint_items().items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads what `state_dict` returned, after checking that it fits.

        Raises:
            CheckpointMismatchError: listing every part missing from `state_dict`, every
                unexpected entry, and for ``nn.Module`` parts every missing or unexpected
                parameter and every shape mismatch. Nothing is loaded in that case.
        """
        load_stateful(self.checkpoint_items(), state_dict, type(self).__name__)


def load_stateful(objects: dict[str, Any], state_dict: dict[str, Any], owner: str) -> None:
    """Loads `state_dict` into stateful `objects` (by path) if it fits them exactly.

    Raises:
        CheckpointMismatchError: listing every difference; nothing is loaded in that case.
    """
    if not isinstance(state_dict, dict):
        raise CheckpointMismatchError(
            f"The checkpoint's state for {owner} is a {type(state_dict).__name__}, not a dict."
        )
    problems = describe_mismatch(objects, state_dict)
    if problems:
        raise CheckpointMismatchError(
            f"The checkpoint does not match this {owner}:\n  - " + "\n  - ".join(problems)
            + "\nLoad a checkpoint written by the same model definition, or load the weights "
            "you want in an init_fn."
        )
    for path, obj in objects.items():
        try:
            obj.load_state_dict(state_dict[path])
        except (KeyError, ValueError, RuntimeError, TypeError) as error:
            raise CheckpointMismatchError(
                f"Cannot load the checkpoint's {path!r} into {type(obj).__name__}: {error}"
            ) from error


def describe_mismatch(objects: dict[str, Any], state_dict: dict[str, Any]) -> list[str]:
    """Every difference between live stateful `objects` and a saved `state_dict` of them."""
    problems = [f"missing from the checkpoint: {p!r}" for p in objects if p not in state_dict]
    problems += [f"unexpected in the checkpoint: {p!r}" for p in state_dict if p not in objects]
    for path, obj in objects.items():
        if not isinstance(obj, nn.Module) or not isinstance(state_dict.get(path), dict):
            continue
        expected = obj.state_dict()
        saved = state_dict[path]
        problems += [f"{path}: missing parameter {k!r}" for k in expected if k not in saved]
        problems += [f"{path}: unexpected parameter {k!r}" for k in saved if k not in expected]
        for key, tensor in expected.items():
            other = saved.get(key)
            if isinstance(other, torch.Tensor) and other.shape != tensor.shape:
                problems.append(
                    f"{path}: {key!r} has shape {tuple(other.shape)} in the checkpoint, "
                    f"{tuple(tensor.shape)} in the model"
                )
    return problems
