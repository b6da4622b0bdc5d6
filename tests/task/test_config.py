"""Configs: defaults from the registry, then files, then overrides; strict and round-tripping."""

import subprocess
import sys

import pytest

from cadence.core.errors import ConfigError
from cadence.task.config import ExperimentConfig
from cadence.task.config_files import config_differences, config_to_yaml, load_config, save_config
from cadence.task.experiments.digits import DigitsTaskConfig


def test_a_registered_experiment_is_the_starting_point():
    config = load_config("digits")
    assert config.experiment == "digits"
    assert isinstance(config.task, DigitsTaskConfig)
    assert config.trainer.best_checkpoint_eval_metric == "accuracy"


def test_no_experiment_means_the_default_one():
    assert load_config().experiment == "digits"


def test_sources_apply_in_order_files_then_overrides(tmp_path):
    first = tmp_path / "first.yaml"
    first.write_text("trainer:\n  train_steps: 10\n  steps_per_loop: 5\n")
    second = tmp_path / "second.yaml"
    second.write_text("trainer:\n  train_steps: 20\ntask:\n  model:\n    hidden_sizes: [8]\n")
    config = load_config("digits", [first, second], ["trainer.train_steps=30"])
    assert config.trainer.train_steps == 30  # the override wins over both files
    assert config.trainer.steps_per_loop == 5  # the first file's value survives the second
    assert config.task.model.hidden_sizes == [8]  # experiment-specific fields are reachable


def test_overrides_parse_yaml_values_and_accept_a_mapping():
    config = load_config("digits", overrides=[
        "runtime.mixed_precision=bf16", "trainer.summary_interval=null",
        "task.model.hidden_sizes=[32,16]", "trainer.optimizer_config.optimizer.learning_rate=1e-4",
    ])
    assert config.runtime.mixed_precision == "bf16"
    assert config.trainer.summary_interval is None
    assert config.task.model.hidden_sizes == [32, 16]
    assert config.trainer.optimizer_config.optimizer.learning_rate == 1e-4
    config = load_config("digits", overrides={"trainer": {"train_steps": 7}})
    assert config.trainer.train_steps == 7


def test_an_unknown_key_names_itself_a_suggestion_and_the_valid_keys():
    with pytest.raises(ConfigError) as error:
        load_config("digits", overrides=["trainer.train_step=5"])
    message = str(error.value)
    assert "--set trainer.train_step=5" in message
    assert "'trainer.train_step'" in message
    assert "Did you mean 'trainer.train_steps'" in message
    assert "checkpoint_interval" in message  # the valid keys are listed


def test_an_unknown_key_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("task:\n  modle:\n    hidden_sizes: [3]\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*'task\.modle'.*Did you mean 'task\.model'"):
        load_config("digits", [path])


def test_a_value_of_the_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"'trainer.train_steps'.*abc"):
        load_config("digits", overrides=["trainer.train_steps=abc"])


def test_values_out_of_range_are_all_listed():
    with pytest.raises(ConfigError) as error:
        load_config("digits", overrides=[
            "trainer.steps_per_loop=0", "runtime.mixed_precision=fp8",
            "trainer.optimizer_config.optimizer.name=adamax", "trainer.compile_mode=fastest",
        ])
    message = str(error.value)
    assert "trainer.steps_per_loop: must be a positive integer (got 0)" in message
    assert "runtime.mixed_precision" in message and "'bf16'" in message
    assert "unknown optimizer 'adamax'; valid: sgd, adam, adamw" in message
    assert "trainer.compile_mode: unknown mode 'fastest'; valid: null, default" in message


@pytest.mark.parametrize("text", ["trainer.train_steps", "=5"])
def test_an_override_without_key_and_value_is_refused(text):
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config("digits", overrides=[text])


def test_missing_and_malformed_files_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("digits", [tmp_path / "nope.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config("digits", [bad])
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config("digits", [listing])


def test_an_unknown_experiment_lists_the_registered_ones():
    with pytest.raises(ConfigError,
                       match=r"Unknown experiment 'digit'.*char_lm, char_lm_large, digits"):
        load_config("digit")


def test_a_saved_config_reloads_exactly_from_the_file_alone(tmp_path):
    config = load_config("char_lm", overrides=["trainer.train_steps=123", "task.model.d_model=48",
                                               "runtime.seed=null"])
    path = save_config(config, tmp_path / "params.yaml")
    reloaded = load_config(config_files=[path])  # the experiment is read from the file
    assert reloaded == config
    assert type(reloaded.task) is type(config.task)
    assert config_to_yaml(reloaded) == path.read_text()


def test_a_file_for_another_experiment_is_refused(tmp_path):
    path = save_config(load_config("char_lm"), tmp_path / "params.yaml")
    with pytest.raises(ConfigError, match="is for experiment 'char_lm', not 'digits'"):
        load_config("digits", [path])


def test_differences_are_listed_by_key_path():
    old = load_config("digits")
    new = load_config("digits", overrides=["trainer.train_steps=5", "task.model.dropout=0.5"])
    assert config_differences(old, new) == [
        "task.model.dropout: 0.1 -> 0.5",
        "trainer.train_steps: 1000 -> 5",
    ]
    assert config_differences(old, old) == []


def test_a_hand_built_config_can_start_the_chain():
    base = ExperimentConfig()
    config = load_config(base, overrides=["trainer.train_steps=3"])
    assert config.trainer.train_steps == 3 and base.trainer.train_steps == 0  # base untouched


def test_builtin_experiments_do_not_depend_on_import_order():
    code = ("import cadence.task.registry as r; print(sorted(r.experiments())); "
            "import cadence.task.config_files as c; print(c.load_config('char_lm').experiment)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.splitlines() == [
        "['char_lm', 'char_lm_large', 'digits', 'gpt', 'gpt2_small']", "char_lm"]


def test_tfm_a_loaded_config_can_be_locked_and_then_refuses_assignments():
    """TF Model Garden locks a parsed config: assigning to any part of it raises afterwards.
    `replace` gives an unlocked copy with changes, as TF Model Garden's `Config.replace`."""
    config = load_config("digits")
    config.trainer.train_steps = 5  # not locked yet
    config.lock()
    assert config.locked and config.task.model.locked
    for part, key in ((config, "experiment"), (config.trainer, "train_steps"),
                      (config.trainer.optimizer_config.optimizer, "learning_rate"),
                      (config.task, "init_checkpoint"), (config.task.model, "dropout")):
        with pytest.raises(ConfigError, match="locked"):
            setattr(part, key, getattr(part, key))
    changed = config.replace(experiment="digits")
    assert not changed.locked and not changed.trainer.locked and changed == config
    changed.trainer.train_steps = 6
    assert config.trainer.train_steps == 5
    assert load_config(config_files=[]).locked is False


def test_tfm_a_config_holding_nan_accepts_its_own_run_directory(tmp_path):
    """NaN != NaN must not make a config differ from itself on resume."""
    from cadence.core.run_dir import RunDirectory
    from cadence.task.config_files import check_saved_config, save_run_config

    def config(beta=".nan"):  # betas are checked to lie in [0, 1): a free-form kwarg holds NaN
        return load_config("digits", overrides=[
            f"trainer.optimizer_config.optimizer.kwargs={{betas: [{beta},0.9]}}"])

    assert config_differences(config(), config()) == []
    run = RunDirectory(tmp_path)
    save_run_config(config(), run, check_saved_config(config(), run))
    save_run_config(config(), run, check_saved_config(config(), run))  # resumed: accepted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing backed up
    with pytest.raises(ConfigError, match=r"kwargs.betas: \[nan, 0.9\] -> \[0.5, 0.9\]"):
        check_saved_config(config(beta="0.5"), run)


def test_runtime_strategy_accepts_exactly_the_strategies_prepare_model_knows():
    """Issue 30, item 4: one `STRATEGIES` (`cadence.engine.strategies`), read by the config and
    by the distributed runtime, so that the two cannot drift: every name the config accepts is
    one `prepare_model` resolves, and an unknown one is refused by both."""
    from torch import nn

    from cadence.engine import parallelize, strategies
    from cadence.task import config_checks

    assert config_checks.STRATEGIES is parallelize.STRATEGIES is strategies.STRATEGIES
    for name in strategies.STRATEGIES:
        load_config("digits", overrides=[f"runtime.strategy={name}"]).validate()
        assert parallelize.resolve_strategy(name, nn.Linear(1, 1)) in ("none", "ddp", "fsdp2")
    with pytest.raises(ConfigError, match="runtime.strategy: must be one of auto, none, ddp"):
        load_config("digits", overrides=["runtime.strategy=deepspeed"]).validate()
    with pytest.raises(ValueError, match="must be one of auto, none, ddp"):
        parallelize.resolve_strategy("deepspeed", nn.Linear(1, 1))


def test_a_config_and_its_strategies_are_checked_without_torch():
    """The strategies live in a torch-free module so that the config, which checks them, imports
    no torch (as with the compile modes)."""
    from pathlib import Path

    blocker = (Path(__file__).parents[1] / "torch_blocker.py").read_text()
    code = (blocker + "\nexec(BLOCK_TORCH)\n"
            "from cadence.task.config import ExperimentConfig\n"
            "from cadence.task.config_checks import STRATEGIES\n"
            "config = ExperimentConfig()\nconfig.runtime.strategy = 'fsdp2'\nconfig.validate()\n"
            "print(STRATEGIES, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "('auto', 'none', 'ddp', 'fsdp2') False"


@pytest.mark.parametrize("settings, says", [
    (["runtime.parallelism.pp_schedule=zbv"],
     "runtime.parallelism.pp_schedule: must be one of gpipe, 1f1b, interleaved_1f1b (got 'zbv')"),
    (["runtime.parallelism.pp=2", "runtime.parallelism.pp_schedule=interleaved_1f1b",
      "runtime.parallelism.pp_stages_per_rank=1"],
     "pp_stages_per_rank: interleaved_1f1b runs several stages per rank (got 1)"),
    (["runtime.parallelism.pp=2", "runtime.parallelism.pp_stages_per_rank=2"],
     "pp_stages_per_rank: 1f1b runs one stage per rank (got 2); set "
     "pp_schedule=interleaved_1f1b for more"),
    (["runtime.parallelism.pp=2", "runtime.parallelism.pp_schedule=interleaved_1f1b",
      "runtime.parallelism.pp_microbatches=2"], None),
    (["runtime.parallelism.pp=4", "runtime.parallelism.pp_microbatches=2"],
     "pp_microbatches (got 2) must be at least the pipeline's stages (4) with "
     "pp_schedule=1f1b; give more, or use gpipe"),
    (["runtime.parallelism.pp=2", "runtime.parallelism.pp_stage_modules=[[wte, blocks]]"],
     "pp_stage_modules gives 1 stages and the pipeline has 2"),
    (["runtime.parallelism.pp=2",
      "trainer.optimizer_config.gradient_accumulation_steps=2"],
     "with pp=2 the pipeline's microbatches are the accumulation"),
    (["runtime.parallelism.pp=2", "runtime.mixed_precision=fp16"],
     "fp16's loss scaling does not work across pp=2 pipeline stages"),
    (["runtime.parallelism.pp=2", "trainer.compile_step=true"],
     "trainer.compile_step: a pipeline's step is its schedule's sends and receives"),
    (["runtime.parallelism.pp=2", "runtime.fault_tolerance.enabled=true"],
     "replica groups are not built for pipelines"),
])
def test_a_pipelines_settings_that_cannot_work_are_named(settings, says):
    """What a pipeline's schedule cannot take, and what does not compose with it, is refused
    with the config, before any process group, in one line naming its key."""
    if says is None:  # interleaved 1F1B takes fewer microbatches than stages
        load_config("gpt", overrides=settings).validate()
        return
    with pytest.raises(ConfigError) as refused:
        load_config("gpt", overrides=settings)
    assert says in str(refused.value), str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("settings, says", [
    (["runtime.parallelism.tp=2"], "runtime.parallelism.tp (got 2) with "
     "runtime.fault_tolerance.enabled: replica groups are built over data shards alone"),
    (["runtime.parallelism.dp_replicate=2"], "runtime.parallelism.dp_replicate (got 2) with "
     "runtime.fault_tolerance.enabled: the replica groups are the replicated dimension"),
])
def test_a_replica_group_with_tensor_parallelism_or_replicas_inside_is_refused(settings, says):
    """Replica groups (the fault-tolerant mode) are the job's replicated dimension, each group
    its data shards: a layout inside a group that is not data shards alone is refused with the
    config, in one line naming the key."""
    with pytest.raises(ConfigError) as refused:
        load_config("gpt", overrides=["runtime.fault_tolerance.enabled=true", *settings])
    assert says in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    load_config("gpt", overrides=["runtime.fault_tolerance.enabled=true",
                                  "runtime.parallelism.dp_shard=2"]).validate()
