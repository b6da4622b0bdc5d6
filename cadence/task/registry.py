"""Registries of experiments and tasks (TF Model Garden's ``exp_factory`` and ``task_factory``).

An experiment is a name bound to a function that returns a fresh `ExperimentConfig`; a task
class is bound to the `TaskConfig` subclass it reads. Lookups do not depend on what the caller
happened to import first (a known pain of TF Model Garden): before any lookup the registry loads
the built-in experiments and every package that declares an entry point in the
``cadence.experiments`` group::

    # pyproject.toml of a package with its own experiments
    [project.entry-points."cadence.experiments"]
    my_experiments = "my_package.experiments"

An experiment in a module that is not a package's is named by its module instead,
``mymodels:my_experiment`` (`cadence.task.module_experiments`).

>>> sorted(experiments())[:2]
['char_lm', 'char_lm_large']
>>> get_experiment_config("digits").experiment
'digits'
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, TypeVar

from cadence.core.errors import NotRegisteredError

if TYPE_CHECKING:
    from cadence.task.config import ExperimentConfig, TaskConfig

logger = logging.getLogger("cadence")

DEFAULT_EXPERIMENT = "digits"
"""What ``cadence train`` runs when no experiment is named."""

BUILTIN_MODULES = ("cadence.task.experiments.digits", "cadence.task.experiments.char_lm",
                   "cadence.task.experiments.gpt")
ENTRY_POINT_GROUP = "cadence.experiments"

_experiments: dict[str, Callable[[], ExperimentConfig]] = {}
_tasks: dict[type, Callable[..., Any]] = {}
_loaded = False
_found_by_itself: set[str] = set()
"""The experiments registered by the modules `_load_all` imports (built-ins, entry points)."""

F = TypeVar("F", bound=Callable[..., Any])


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    before = set(_experiments)
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    entries = entry_points(group=ENTRY_POINT_GROUP)
    for entry in entries:
        try:
            entry.load()
        except Exception as error:  # a broken plugin must not break the built-ins
            logger.warning("Could not load experiments from %s (%s): %s", entry.name,
                           entry.value, error)
    # Those registered now, and those whose modules were imported before the registry was
    # first asked (their names are already in `before`).
    modules = {*BUILTIN_MODULES, *(entry.value.partition(":")[0].strip() for entry in entries)}
    _found_by_itself.update(name for name, factory in _experiments.items()
                            if name not in before or factory.__module__ in modules)


def register_experiment(name: str) -> Callable[[F], F]:
    """Decorates a function with no arguments that returns an `ExperimentConfig`.

    Raises:
        ValueError: if `name` is already registered.
        TypeError: if what it decorates is not callable.
    """

    def decorator(factory: F) -> F:
        if not callable(factory):
            raise TypeError(f"@register_experiment({name!r}) decorates a function that returns "
                            f"an ExperimentConfig (got {type(factory).__name__}).")
        if name in _experiments and _experiments[name] is not factory:
            raise ValueError(f"Experiment {name!r} is already registered "
                             f"(by {_experiments[name].__module__}); pick another name.")
        _experiments[name] = factory
        return factory

    return decorator


def register_task(config_cls: type[TaskConfig]) -> Callable[[F], F]:
    """Decorates the `Task` class (or a factory) built from configs of type `config_cls`.

    Raises:
        ValueError: if a task is already registered for `config_cls`.
    """

    def decorator(task_cls: F) -> F:
        if config_cls in _tasks and _tasks[config_cls] is not task_cls:
            raise ValueError(f"A task is already registered for {config_cls.__name__}: "
                             f"{_tasks[config_cls]!r}.")
        _tasks[config_cls] = task_cls
        return task_cls

    return decorator


def experiments() -> dict[str, str]:
    """Registered experiment names and the first line of each one's description."""
    _load_all()
    return {name: (factory.__doc__ or "").strip().splitlines()[0] if factory.__doc__ else ""
            for name, factory in sorted(_experiments.items())}


def experiment_functions() -> dict[str, Callable[[], ExperimentConfig]]:
    """Registered experiment names and the function each one is registered with."""
    _load_all()
    return dict(sorted(_experiments.items()))


def found_by_itself(name: str) -> bool:
    """Whether the registry finds the experiment `name` without being told where: registered
    by a built-in module or an installed package's entry point."""
    _load_all()
    return name in _found_by_itself


def get_experiment_config(name: str) -> ExperimentConfig:
    """A fresh copy of the registered experiment's config.

    Raises:
        NotRegisteredError: (a `ConfigError` and a `KeyError`) if no experiment has that name;
            the message lists the registered ones.
    """
    _load_all()
    if name not in _experiments:
        raise NotRegisteredError(
            f"Unknown experiment {name!r}. Registered: {', '.join(sorted(_experiments))}. "
            "`cadence experiments` lists them; name one of your own by its module, e.g. "
            "mymodels:my_experiment or path/to/mymodels.py:my_experiment, or a package adds "
            f"its own through the {ENTRY_POINT_GROUP!r} entry-point group."
        )
    config = _experiments[name]()
    config.experiment = name
    return config


def task_config_class(name: str) -> type | None:
    """The registered `TaskConfig` class whose ``module.QualName`` is `name` (the newest one
    registered under that name), or None."""
    _load_all()
    found = [cls for cls in _tasks if f"{cls.__module__}.{cls.__qualname__}" == name]
    return found[-1] if found else None


def get_task(task_config: TaskConfig, **kwargs: Any) -> Any:
    """Builds the task registered for ``type(task_config)`` (or its nearest registered base).

    Raises:
        NotRegisteredError: (a `ConfigError` and a `KeyError`) if no task is registered for the
            config's class.
    """
    _load_all()
    for cls in type(task_config).__mro__:
        if cls in _tasks:
            return _tasks[cls](task_config, **kwargs)
    raise NotRegisteredError(
        f"No task is registered for {type(task_config).__name__}: decorate the Task class with "
        f"@cadence.register_task({type(task_config).__name__})."
    )
