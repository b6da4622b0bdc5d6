"""The registries of experiments and tasks."""

from dataclasses import dataclass

import pytest

import cadence.task.registry as registry
from cadence.core.errors import ConfigError
from cadence.task.config import ExperimentConfig, TaskConfig
from cadence.task.experiments.digits import DigitsTask, DigitsTaskConfig


def test_tasks_are_found_by_config_class_including_subclasses():
    @dataclass
    class WiderDigits(DigitsTaskConfig):
        width_multiplier: int = 2

    assert isinstance(registry.get_task(DigitsTaskConfig()), DigitsTask)
    assert isinstance(registry.get_task(WiderDigits()), DigitsTask)  # nearest registered base


def test_an_unregistered_task_config_says_how_to_register():
    @dataclass
    class Orphan(TaskConfig):
        pass

    with pytest.raises(ConfigError, match=r"@cadence.register_task\(Orphan\)"):
        registry.get_task(Orphan())


def test_a_name_is_registered_once(monkeypatch):
    monkeypatch.setattr(registry, "_experiments", dict(registry._experiments))

    @registry.register_experiment("mine")
    def mine() -> ExperimentConfig:
        """My experiment."""
        return ExperimentConfig()

    assert registry.experiments()["mine"] == "My experiment."
    assert registry.get_experiment_config("mine").experiment == "mine"
    with pytest.raises(ValueError, match="'mine' is already registered"):
        registry.register_experiment("mine")(lambda: ExperimentConfig())


def test_plugins_come_from_entry_points_and_a_broken_one_is_only_a_warning(monkeypatch, caplog):
    class Entry:
        def __init__(self, name, value, load):
            self.name, self.value, self.load = name, value, load

    def register_plugin():
        registry.register_experiment("from_plugin")(lambda: ExperimentConfig())

    def broken():
        raise ImportError("no such module")

    monkeypatch.setattr(registry, "_experiments", dict(registry._experiments))
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "entry_points", lambda group: [
        Entry("good", "plugin.good", register_plugin), Entry("bad", "plugin.bad", broken)])
    assert "from_plugin" in registry.experiments()
    assert "digits" in registry.experiments()
    assert "Could not load experiments from bad (plugin.bad): no such module" in caplog.text


def test_tfm_registry_lookups_of_unknown_names_raise_a_key_error():
    """TF Model Garden's registries raise KeyError for an unknown name; cadence's error is also
    a ConfigError and keeps its message listing what is registered."""

    @dataclass
    class Orphan(TaskConfig):
        pass

    with pytest.raises(KeyError) as error:
        registry.get_experiment_config("no_such_experiment")
    assert isinstance(error.value, ConfigError)
    assert str(error.value).startswith("Unknown experiment 'no_such_experiment'. Registered: ")
    with pytest.raises(KeyError) as error:
        registry.get_task(Orphan())
    assert isinstance(error.value, ConfigError)
    assert str(error.value).startswith("No task is registered for Orphan")
