import os
import sys
from pathlib import Path

# One intra-op thread in each test process and in the processes the tests start (unless the
# environment says otherwise): two workers (pytest-xdist) and the jobs they start share two
# cores, and torch's OpenMP threads contending there for the same cores ran the digits
# experiment's 1,000 tiny steps in 76 s instead of 3.4.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

if os.environ["OMP_NUM_THREADS"].isdigit():  # torch may have been imported before this file
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def compile_counter(monkeypatch):
    """Makes every ``torch.compile`` (cadence's compiled steps too) use a `CountingBackend`, with
    a recompile limit high enough that a step recompiled per step never falls back to eager."""
    import functools

    import torch._dynamo
    from fakes import CountingBackend

    backend = CountingBackend()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    name = next(n for n in ("recompile_limit", "cache_size_limit")
                if hasattr(torch._dynamo.config, n))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(**{name: 64}):
        yield backend
    torch._dynamo.reset()


@pytest.fixture
def local_mlflow(monkeypatch):
    """MLflow with no tracking server or experiment from the environment: the writer's defaults
    (a file store next to the run directory, ``<run>/../mlruns``) apply. Reading a file store
    back needs ``MLFLOW_ALLOW_FILE_STORE``, as ``mlflow ui`` does."""
    pytest.importorskip("mlflow")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """wandb offline and silent, its settings and caches in a temporary directory."""
    pytest.importorskip("wandb")
    home = tmp_path / ".wandb-home"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    for name in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def user_modules(monkeypatch):
    """Imports of a user's own modules (``cadence train -e mymodels:NAME``) undone after the
    test: the modules, ``sys.path``, the experiments and tasks they registered; and no
    ``__pycache__`` written beside them."""
    import importlib
    import tempfile

    from cadence.task import module_experiments, registry

    registry.experiments()  # the built-ins and plugins stay
    modules, path = set(sys.modules), list(sys.path)
    experiments, tasks = dict(registry._experiments), dict(registry._tasks)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(module_experiments, "_file_modules", {})
    monkeypatch.setattr(module_experiments, "_registered_by", {})
    yield
    temporary = tempfile.gettempdir()
    for name in set(sys.modules) - modules:  # the user's, not torch's that loaded lazily
        if name.startswith(module_experiments.FILE_MODULE_PREFIX) or str(
                getattr(sys.modules[name], "__file__", None) or "").startswith(temporary):
            del sys.modules[name]
    sys.path[:] = path
    registry._experiments.clear()
    registry._experiments.update(experiments)
    registry._tasks.clear()
    registry._tasks.update(tasks)
    importlib.invalidate_caches()
