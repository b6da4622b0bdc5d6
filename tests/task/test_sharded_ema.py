"""An EMA of a sharded model (FSDP2; tensor parallelism alike): each rank averages its own
shards, an evaluation gathers the average's, checkpoints save it through DCP, and `cadence
eval` and `cadence export` read it -- the same values as the EMA of the model whole."""

import json

import pytest
import torch
from safetensors.torch import load_file

from cadence.engine.runtime import shutdown
from cadence.task.cli import main
from cadence.task.config_files import load_config
from cadence.task.train_lib import run_experiment

SETTINGS = ["trainer.train_steps=40", "trainer.steps_per_loop=10",
            "trainer.validation_interval=20", "trainer.checkpoint_interval=20",
            "trainer.ema.enabled=true", "trainer.ema.decay=0.9", "runtime.device=cpu",
            "trainer.best_checkpoint_eval_metric=accuracy", "task.model.hidden_sizes=[32]"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """digits with an EMA, the model whole and sharded by FSDP2 (in a group of one)."""
    root = tmp_path_factory.mktemp("sharded-ema")
    logs = {}
    for strategy in ("none", "fsdp2"):
        config = load_config("digits", overrides=[*SETTINGS, f"runtime.strategy={strategy}"])
        _, logs[strategy] = run_experiment(config, "train_and_eval", root / strategy)
        shutdown()
    return root, logs


def test_the_sharded_average_evaluates_as_the_whole_one(runs):
    root, logs = runs
    assert logs["fsdp2"] == logs["none"]
    assert (root / "fsdp2" / "checkpoints" / "ckpt-40" / "sharded" / ".metadata").is_file()


def test_eval_and_export_of_the_sharded_average_read_what_the_run_evaluated(runs, tmp_path,
                                                                           capsys):
    root, logs = runs
    best = json.loads((root / "fsdp2" / "best" / "info.json").read_text())["exports"][0]
    for choice, expected in (("best", best["value"]), ("latest", logs["fsdp2"]["accuracy"])):
        capsys.readouterr()
        assert main(["eval", "-m", str(root / "fsdp2"), "--checkpoint", choice]) == 0
        out = capsys.readouterr().out
        assert f"Evaluation: accuracy={expected:.6g}" in out, out
        shutdown()
    for strategy in ("none", "fsdp2"):
        assert main(["export", str(root / strategy), "--out", str(tmp_path / strategy)]) == 0
    assert "the EMA weights (what the run evaluates)" in capsys.readouterr().out
    sharded = load_file(str(tmp_path / "fsdp2" / "model.safetensors"))
    whole = load_file(str(tmp_path / "none" / "model.safetensors"))
    assert sharded.keys() == whole.keys()
    assert all(torch.equal(sharded[name], whole[name]) for name in whole)
