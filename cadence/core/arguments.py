"""Arguments of the wrong kind at the public entry points, each refused in one line that names
the entry point, the argument, what was received and what it must be.

Python would otherwise fail later and deeper, naming no argument: ``run_experiment(config,
"train", 123)`` was ``TypeError: expected str, bytes or os.PathLike object, not int`` from inside
``pathlib``. `run_experiment`, `load_config`, the `Controller`, `TrainLoop` and the tensorpack
entry points check their arguments' kinds with these before anything is made or written; a
value of the right kind that cannot work is `cadence.core.intervals.check_int`'s or the config
checks'. Nothing here imports torch.

>>> check_path("run_experiment", "model_dir", 123, "e.g. 'runs/mine'")
Traceback (most recent call last):
...
TypeError: run_experiment: `model_dir` (got int 123) must be a path (a str or an os.PathLike), ...
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cadence.core.callbacks import Callback
from cadence.core.hook_checks import describe


def _refuse(owner: str, name: str, value: Any, must: str, example: str) -> TypeError:
    return TypeError(f"{owner}: `{name}` (got {describe(value)}) must be {must}, {example}.")


def check_path(owner: str, name: str, value: Any, example: str, *,
               none_ok: bool = False) -> Path | None:
    """`value` as a `Path`: a str or an `os.PathLike` (None where `none_ok`).

    Raises:
        TypeError: for anything else (bytes included), naming `owner` and `name`.
    """
    if value is None and none_ok:
        return None
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        path = os.fspath(value)
        if isinstance(path, str):
            return Path(path)
    must = "a path (a str or an os.PathLike)" + (" or None" if none_ok else "")
    raise _refuse(owner, name, value, must, example)


def _of_kind(owner: str, name: str, value: Any, example: str, none_ok: bool, must: str,
             holds: Callable[[Any], bool]) -> Any:
    """`value` if `holds` says it is of its kind (or it is None where `none_ok`).

    Raises:
        TypeError: for anything else, naming `owner` and `name` and what it `must` be.
    """
    if holds(value) or (value is None and none_ok):
        return value
    raise _refuse(owner, name, value, must + (" or None" if none_ok else ""), example)


def check_bool(owner: str, name: str, value: Any, example: str, *,
               none_ok: bool = False) -> bool | None:
    """`value` if it is True or False (or None where `none_ok`): a string such as ``"no"``
    would read as true.

    Raises:
        TypeError: for anything else, naming `owner` and `name`.
    """
    return _of_kind(owner, name, value, example, none_ok, "True or False",
                    lambda given: isinstance(given, bool))


def check_str(owner: str, name: str, value: Any, example: str, *,
              none_ok: bool = False) -> str | None:
    """`value` if it is a str (or None where `none_ok`).

    Raises:
        TypeError: for anything else, naming `owner` and `name`.
    """
    return _of_kind(owner, name, value, example, none_ok, "a str",
                    lambda given: isinstance(given, str))


def check_callable(owner: str, name: str, value: Any, example: str, *,
                   none_ok: bool = False) -> Callable[..., Any] | None:
    """`value` if it can be called (or None where `none_ok`).

    Raises:
        TypeError: for anything else, naming `owner` and `name`.
    """
    return _of_kind(owner, name, value, example, none_ok, "a function", callable)


def check_items(owner: str, name: str, value: Any, must: str, example: str,
                item: Callable[[Any], bool] | None = None) -> list[Any]:
    """`value` as a list: an iterable (not a str, bytes or mapping, which iterate as characters
    or keys), each of whose items passes `item` when given.

    Args:
        owner, name: the entry point and the argument, for the message.
        value: what was given.
        must: what it must be, in words (``"a list of cadence.Callback objects"``).
        example: the right usage (``"e.g. callbacks=[cadence.ProgressBar()]"``).
        item: whether one item is of the right kind.

    Raises:
        TypeError: for a value that is not such an iterable, or an item of the wrong kind.
    """
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise _refuse(owner, name, value, must, example)
    items = list(value)
    for index, one in enumerate(items):
        if item is not None and not item(one):
            raise TypeError(f"{owner}: `{name}[{index}]` (got {describe(one)}) is not what "
                            f"`{name}` must hold: {must}, {example}.")
    return items


def check_mapping(owner: str, name: str, value: Any, example: str, *,
                  none_ok: bool = False) -> Mapping[Any, Any] | None:
    """`value` if it is a mapping (or None where `none_ok`).

    Raises:
        TypeError: for anything else, naming `owner` and `name`.
    """
    return _of_kind(owner, name, value, example, none_ok, "a mapping (a dict)",
                    lambda given: isinstance(given, Mapping))


def check_run_hooks(owner: str, callbacks: Any, train_actions: Any, eval_actions: Any,
                    ) -> tuple[list[Callback], list[Any], list[Any]]:
    """The callbacks (`cadence.Callback` objects) and the Orbit actions (functions of the
    logs) of a run's driver, as lists (a generator is read once, here).

    Raises:
        TypeError: for one of them that is not a list of its kind, naming it.
    """
    checked = check_items(owner, "callbacks", callbacks, "a list of cadence.Callback objects",
                          "e.g. callbacks=[cadence.ProgressBar()]",
                          lambda one: isinstance(one, Callback))
    actions = [check_items(owner, name, given, "a list of functions of the logs",
                           f"e.g. {name}=[print]", callable)
               for name, given in (("train_actions", train_actions),
                                   ("eval_actions", eval_actions))]
    return checked, actions[0], actions[1]
