"""Keeps MLflow and wandb away from the network, the home directory and the environment's
settings."""

import pytest


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
