"""`Config.replace` as TF Model Garden's: a mapping for a sub-config builds the sub-config
(its ``override``), merged into the one there; unknown keys raise as ``--set`` does."""

import re

import pytest

from cadence.core.errors import ConfigError
from cadence.task.config import EMAConfig, ExperimentConfig, TrainerConfig
from cadence.task.config_files import load_config


def test_config_replace_builds_sub_configs_as_model_garden():
    config = load_config("digits", overrides=["trainer.steps_per_loop=7"])
    config.lock()
    changed = config.replace(trainer={"train_steps": 50, "ema": {"decay": 0.5}})
    assert isinstance(changed.trainer, TrainerConfig)
    assert isinstance(changed.trainer.ema, EMAConfig)
    assert changed.trainer.train_steps == 50
    assert changed.trainer.steps_per_loop == 7  # not named: kept
    assert changed.trainer.ema.decay == 0.5
    assert changed.trainer.ema.enabled is config.trainer.ema.enabled  # nested: merged too
    assert type(changed.task) is type(config.task) and changed.task == config.task
    assert not changed.locked and not changed.trainer.locked
    assert config.trainer.train_steps != 50 and config.locked  # the original is untouched
    changed.trainer.train_steps = 3  # a real, unlocked TrainerConfig


def test_config_replace_still_takes_whole_sub_configs_and_plain_values():
    trainer = TrainerConfig(train_steps=9)
    changed = ExperimentConfig().replace(trainer=trainer, experiment="mine")
    assert changed.trainer == trainer and changed.experiment == "mine"
    assert ExperimentConfig().trainer.replace(ema={"enabled": True}).ema.enabled is True


@pytest.mark.parametrize(("changes", "message"), [
    ({"trainer": {"train_step": 5}},
     "replace: unknown key 'trainer.train_step'. Did you mean 'trainer.train_steps'?"),
    ({"trainer": {"ema": {"decey": 0.5}}}, "replace: unknown key 'trainer.ema.decey'. Did you "
     "mean 'trainer.ema.decay'? Valid keys of 'trainer.ema': enabled, decay,"),
    ({"trainr": {"train_steps": 5}}, "replace: unknown key 'trainr'. Did you mean 'trainer'?"),
    ({"trainer": {"train_steps": "many"}}, "replace: 'trainer.train_steps'"),
])
def test_config_replace_refuses_unknown_keys_as_set_does(changes, message):
    config = ExperimentConfig()
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        config.replace(**changes)
    with pytest.raises(ConfigError, match="unknown key 'trainer.train_step'"):
        load_config(config, overrides=["trainer.train_step=5"])  # the same error, from --set
