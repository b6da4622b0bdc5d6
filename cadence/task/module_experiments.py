"""Experiments in a module of one's own: ``MODULE:NAME`` and ``path/to/file.py:NAME``.

``cadence train -e mymodels:my_experiment`` imports ``mymodels`` -- the current directory is
importable, as ``python -m`` makes it (it is put first on ``sys.path`` when it is not there, and
stays, for the module's own imports) -- and ``-e path/to/mymodels.py:my_experiment`` imports that
file, once per process, as a module of its own (``_cadence_file_mymodels``; registered in
``sys.modules`` before it runs, as dataclasses need). NAME is then an experiment the module
registers (`cadence.register_experiment`), or a function there that takes no arguments and returns
an `ExperimentConfig`. ``cadence.load_config`` and ``cadence.run_experiment`` take the same
spelling. The module is recorded in the config (``experiment_module``, beside ``experiment``),
so ``params.yaml`` says how the run was reached, and ``cadence train -m RUN``, ``cadence eval -m
RUN`` and ``cadence config -m RUN`` find it again without ``-e``::

    experiment: my_experiment
    experiment_module: mymodels          # or: path/to/mymodels.py, as it was named

An experiment the registry finds by itself (built-in, or an installed package's entry point)
records no module (``experiment_module: ''``), however it was named.

The trust boundary. The module is the user's own code, named by the user with ``-e``: it is
imported as Python imports it. A run directory is untrusted input, and reading one never runs
code that came with it (``cadence inspect`` imports nothing). What its ``params.yaml`` records
is imported again -- by the command line's ``-m RUN`` without ``-e``, and by ``load_config`` of
that file -- only as ``-e`` would import it, and only from where the user's own code lives:

- a recorded module name only when it is a file of the current folder, found there on disk before
  anything is imported (never the standard library, an installed package, or anything else on
  ``sys.path``), and only if the module of that name is that file; a recorded ``.py`` path as
  recorded, relative to the current folder or absolute;
- never a file inside the folder of the ``params.yaml`` that records it (the run directory);
- NAME only as an experiment that module registers, or a plain function of no arguments (never a
  class, a built-in or another callable), as for ``-e``.

The command line says which module it imports, and why, before it does (``load_config`` logs
it). Anything else is one error naming the module, which says to pass ``-e`` to import it
oneself -- the way to evaluate a run directory someone else made, with one's own module. What
this does not guard against: the current folder's files outside the run directory are taken
as the user's own code, so a run directory whose record names a file beside it (brought in
with it) is as safe as that file.

>>> split_spelling("mymodels:my_experiment"), split_spelling("digits")
(('mymodels', 'my_experiment'), None)
>>> split_spelling("./src/my_models.py:small")
('src/my_models.py', 'small')
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

from cadence.core.errors import ConfigError, NotRegisteredError
from cadence.core.run_dir import PARAMS_FILE
from cadence.task.registry import experiment_functions, found_by_itself, get_experiment_config

if TYPE_CHECKING:
    from cadence.task.config import ExperimentConfig

logger = logging.getLogger("cadence")

FILE_MODULE_PREFIX = "_cadence_file_"
"""The start of the name a ``.py`` file named by its path is imported under."""

_file_modules: dict[Path, str] = {}
"""The ``.py`` files imported by path in this process, and each one's module name."""
_registered_by: dict[str, set[str]] = {}
"""The experiments each module's import registered, as seen when this module imported it."""


def split_spelling(text: str) -> tuple[str, str] | None:
    """``(module, name)`` of ``"MODULE:NAME"`` or ``"path/to/file.py:NAME"`` (a file path
    normalized), or None for a registered experiment's plain name.

    Raises:
        ConfigError: if the module or the name is empty.
    """
    if ":" not in text:
        return None
    module, _, name = text.rpartition(":")
    if not module.strip() or not name.strip():
        raise ConfigError(
            f"Experiment {text!r}: {'the module' if not module.strip() else 'NAME'} is empty; "
            "name an experiment of your own as MODULE:NAME or path/to/file.py:NAME, e.g. "
            "mymodels:my_experiment.")
    return (os.path.normpath(module) if is_file(module) else module), name


def is_file(module: str) -> bool:
    """Whether the module part of a spelling is a path to a ``.py`` file (rather than a dotted
    module name)."""
    return module.endswith(".py") or "/" in module or os.sep in module


def spelled(module: str, name: str) -> str:
    """The ``MODULE:NAME`` spelling of an experiment; just NAME when `module` is empty."""
    return f"{module}:{name}" if module else name


def experiment_from_module(module: str, name: str, *,
                           recorded_in: str | os.PathLike[str] | None = None) -> ExperimentConfig:
    """A fresh config of the experiment NAME of `module` (a dotted module name, or a path to a
    ``.py`` file), with ``experiment`` and ``experiment_module`` set.

    Args:
        module: ``"mymodels"``, ``"pkg.experiments"`` or ``"path/to/mymodels.py"``.
        name: an experiment `module` registers, or a function there that takes no arguments and
            returns an `ExperimentConfig`.
        recorded_in: the config file (a run's ``params.yaml``) that records `module`, when the
            caller did not name it: then only what the module docstring allows is imported.

    Raises:
        ConfigError: if the module cannot be imported (naming the import error's first line)
            or, recorded, is not one cadence imports from a record; if NAME is neither an
            experiment the module registers nor a function there of no arguments, or the
            function does not return an `ExperimentConfig`.
        NotRegisteredError: (a `ConfigError`) if the module has no NAME, listing what it
            registers and its functions of no arguments.
    """
    from cadence.task.config import ExperimentConfig

    text = spelled(module, name)
    loaded = _import(module, text, None if recorded_in is None else Path(recorded_in))
    functions = {n: f for n, f in experiment_functions().items() if n in registered_by(loaded)}
    if name in functions:
        config = get_experiment_config(name)
    else:
        function = _function(loaded, module, name, functions)
        config = function()
        if not isinstance(config, ExperimentConfig):
            raise ConfigError(
                f"Experiment {text}: {name}() returned {_what(config)}; an experiment function "
                "must return a cadence.ExperimentConfig, e.g. "
                "cadence.ExperimentConfig(task=MyTaskConfig()).")
        # A function registered under another name is that experiment.
        config.experiment = next((n for n, f in functions.items() if f is function), name)
    config.experiment_module = "" if found_by_itself(config.experiment) else module
    return config


def registered_by(module: ModuleType) -> list[str]:
    """The experiments `module` registers: those its import registered, and those whose
    function it defines."""
    names = set(_registered_by.get(module.__name__, ()))
    names.update(n for n, f in experiment_functions().items()
                 if f.__module__ == module.__name__)
    return sorted(names)


def no_argument_functions(module: ModuleType) -> list[str]:
    """The public functions `module` defines that take no arguments: those that could return
    an `ExperimentConfig`."""
    return sorted(name for name, value in vars(module).items()
                  if not name.startswith("_") and inspect.isfunction(value)
                  and value.__module__ == module.__name__ and not _required(value))


# ---------------------------------------------------------------------------- importing


def _import(module: str, text: str, recorded_in: Path | None) -> ModuleType:
    """The imported `module` (from a record, only what the module docstring allows)."""
    experiment_functions()  # the built-ins and entry points first: they are not the module's
    importlib.invalidate_caches()  # a file written a moment ago is found
    if recorded_in is not None:
        logger.info("Importing %s: %s records it as the module of experiment %s.", module,
                    recorded_in, text)
    if is_file(module):
        path = Path(module)
        if recorded_in is not None:
            _check_recorded(path, text, recorded_in)
        return _import_file(path, text)
    if not all(part.isidentifier() for part in module.split(".")):
        raise ConfigError(
            f"Experiment {text}: {module!r} is neither a module name (dotted names, e.g. "
            "mymodels or pkg.experiments) nor a path to a .py file: name an experiment as "
            "MODULE:NAME or path/to/file.py:NAME.")
    here = Path.cwd()
    found = _file_in_folder(module, here)
    if recorded_in is not None:
        if found is None:
            raise ConfigError(
                f"{str(recorded_in)!r} records the experiment {text}, but {module} is not a "
                f"module of the current folder ({here}); cadence imports a recorded module only "
                "from there. Run the command from the folder the run was started in, or pass "
                f"-e {text} to import it yourself.")
        _check_recorded(found, text, recorded_in)
    if found is not None and found.resolve() in _file_modules and (
            _file_modules[found.resolve()] in sys.modules):  # imported by its path before
        return sys.modules[_file_modules[found.resolve()]]
    if str(here) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(here))  # as `python -m` makes it; for the module's own imports
    loaded = _imported(module, text, lambda: importlib.import_module(module))
    if recorded_in is not None and found is not None and (
            Path(str(loaded.__file__)).resolve() != found.resolve()):
        raise ConfigError(
            f"{str(recorded_in)!r} records the experiment {text}, but {module} is already "
            f"imported from {loaded.__file__}, not from the current folder's {found}: pass -e "
            f"{found}:{text.rpartition(':')[2]} to import that file.")
    return loaded


def _imported(module: str, text: str, load: Callable[[], ModuleType]) -> ModuleType:
    """`load()`, the import of `module`, noting what it registers; an exception the import
    raises is one `ConfigError` naming the module, the error's first line and where it was
    raised."""
    before = set(experiment_functions())
    try:
        loaded = load()
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        where = _where(error)
        problem = (f"{type(error).__name__}{': ' + first if first else ''}"
                   f"{', at ' + where if where else ''}")
        if isinstance(error, ModuleNotFoundError) and error.name is not None and (
                module == error.name or module.startswith(f"{error.name}.")):
            top = module.split(".")[0]
            holds = f"the package {top}" if "." in module else f"{top}.py"
            fix = (f"run the command from the folder that holds {holds} (the current folder "
                   "is importable), or name its file: -e path/to/"
                   f"{module.rpartition('.')[2]}.py:{text.rpartition(':')[2]}")
        elif isinstance(error, ModuleNotFoundError) and error.name:
            fix = f"install {error.name.split('.')[0]}, or change the import"
        else:
            fix = "fix the module and run again"
        raise ConfigError(f"Experiment {text}: cannot import {module} ({problem}): "
                          f"{fix}.") from None
    new = set(experiment_functions()) - before
    if new:
        _registered_by.setdefault(loaded.__name__, set()).update(new)
    return loaded


def _where(error: BaseException) -> str:
    """``file:line`` where `error` was raised, outside the import machinery (a SyntaxError
    names its place itself)."""
    if isinstance(error, SyntaxError):
        return ""
    frames = [frame for frame in _frames(error.__traceback__)
              if not frame[0].startswith("<") and "importlib" not in frame[0]
              and not frame[0].startswith(str(Path(__file__).parent))]
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""


def _frames(tb: TracebackType | None) -> list[tuple[str, int]]:
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def _import_file(path: Path, text: str) -> ModuleType:
    """The ``.py`` file at `path`, imported once per process under a name of its own."""
    if not path.is_file():
        what = "a directory" if path.is_dir() else f"no such file in {Path.cwd()}"
        raise ConfigError(f"Experiment {text}: cannot import {path} ({what}): pass the path of "
                          f"a .py file, e.g. path/to/mymodels.py:{text.rpartition(':')[2]}.")
    if path.suffix != ".py":
        raise ConfigError(f"Experiment {text}: {path} is not a .py file: pass the path of a "
                          f"Python file, e.g. path/to/mymodels.py:{text.rpartition(':')[2]}.")
    resolved = path.resolve()
    if resolved in _file_modules and _file_modules[resolved] in sys.modules:
        return sys.modules[_file_modules[resolved]]
    imported = _module_of_file(resolved)
    if imported is not None:  # as a module by its name: one file, one module
        return imported
    stem = re.sub(r"\W", "_", resolved.stem)
    name, suffix = f"{FILE_MODULE_PREFIX}{stem}", 1
    while name in sys.modules:  # another file of that name, imported before
        suffix += 1
        name = f"{FILE_MODULE_PREFIX}{stem}_{suffix}"

    def load() -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, resolved)
        assert spec is not None and spec.loader is not None  # a .py file has both
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before it runs: dataclasses look their module up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module

    loaded = _imported(str(path), text, load)
    _file_modules[resolved] = name
    return loaded


def _module_of_file(path: Path) -> ModuleType | None:
    """The module imported from the file at `path` (resolved), if one was."""
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.endswith(path.name) and Path(file).resolve() == path:
            return module
    return None


def _file_in_folder(module: str, folder: Path) -> Path | None:
    """The file that defines the dotted `module` in `folder` (``a/b.py`` or
    ``a/b/__init__.py``), found on disk without importing anything; None if there is none."""
    *packages, last = module.split(".")
    directory = folder.joinpath(*packages)
    for candidate in (directory / f"{last}.py", directory / last / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _check_recorded(path: Path, text: str, recorded_in: Path) -> None:
    """Refuses a recorded file that came with the run: one inside the folder of the
    ``params.yaml`` that records it."""
    if recorded_in.name == PARAMS_FILE and path.resolve().is_relative_to(
            recorded_in.parent.resolve()):
        raise ConfigError(
            f"{str(recorded_in)!r} records the experiment {text}, whose file {path} is inside "
            "that run directory: cadence never runs code that came with a run. Pass -e "
            f"{text} to import it yourself if you trust it, or -e naming your own module.")


# ---------------------------------------------------------------------------- NAME

_WHAT_NAME_IS = ("must be an experiment the module registers (@cadence.register_experiment) or "
                 "a function there that takes no arguments and returns a "
                 "cadence.ExperimentConfig")


def _function(module: ModuleType, spelling: str, name: str,
              registered: dict[str, Callable[[], Any]]) -> Callable[[], Any]:
    """The function NAME of `module`, which must take no arguments.

    Raises:
        NotRegisteredError: if `module` has no NAME, listing what it offers.
        ConfigError: if NAME is not a function, or takes arguments.
    """
    text = spelled(spelling, name)
    if not hasattr(module, name):
        factories = set(map(id, registered.values()))
        functions = [f for f in no_argument_functions(module)
                     if id(getattr(module, f)) not in factories]
        close = difflib.get_close_matches(name, [*registered, *functions], n=1)
        raise NotRegisteredError(
            f"Experiment {text}: {spelling} has no experiment or function {name!r}."
            + (f" Did you mean {spelled(spelling, close[0])}?" if close else "")
            + f" It registers: {', '.join(registered) or 'no experiments'}; its functions "
            f"of no arguments: {', '.join(functions) or 'none'}. NAME {_WHAT_NAME_IS}.")
    value = getattr(module, name)
    if not inspect.isfunction(value):
        wrap = (f" (wrap it: def {name}(): return ...)"
                if type(value).__name__ == "ExperimentConfig" else "")
        raise ConfigError(f"Experiment {text} is {_what(value)}{wrap}, not an experiment: "
                          f"NAME {_WHAT_NAME_IS}.")
    required = _required(value)
    if required:
        raise ConfigError(f"Experiment {text} is a function of arguments ({', '.join(required)})"
                          f", not an experiment: NAME {_WHAT_NAME_IS}.")
    return value


def _required(function: Callable[..., Any]) -> list[str]:
    """The parameters of `function` that have no default."""
    parameters = inspect.signature(function).parameters.values()
    return [p.name for p in parameters if p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _what(value: Any) -> str:
    """What `value` is, in words: ``the class Blobs (a cadence.Task)``, ``an int``."""
    if inspect.isclass(value):
        ours = [b.__name__ for b in value.__mro__[1:] if b.__module__.startswith("cadence.")]
        return f"the class {value.__qualname__}{f' (a cadence.{ours[0]})' if ours else ''}"
    if inspect.ismodule(value):
        return f"the module {value.__name__}"
    if value is None:
        return "None"
    kind = "built-in function" if inspect.isbuiltin(value) else type(value).__name__
    return f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}"
