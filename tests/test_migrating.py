"""The migration guides (docs/migrating/): each shows its cadence program exactly as
examples/migrating/ holds it, and each program trains end to end in seconds and resumes."""

import functools
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
GUIDES = ROOT / "docs" / "migrating"
EXAMPLES = ROOT / "examples" / "migrating"
PROGRAMS = {
    "orbit.md": "from_orbit",
    "tf-model-garden.md": "from_tf_model_garden",
    "tensorpack.md": "from_tensorpack",
    "tfsnippet.md": "from_tfsnippet",
    "lightning.md": "from_lightning",
}


@functools.cache
def load(name):
    """The example module, loaded once (the Task examples register their task and experiment)."""
    spec = importlib.util.spec_from_file_location(f"migrating_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def jsonl_steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_every_guide_and_program_is_listed():
    assert sorted(p.name for p in GUIDES.glob("*.md") if p.name != "README.md") == sorted(
        PROGRAMS)
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == sorted(PROGRAMS.values())
    index = (GUIDES / "README.md").read_text()
    assert all(f"({guide})" in index for guide in PROGRAMS)


@pytest.mark.parametrize(("guide", "program"), PROGRAMS.items())
def test_each_guide_shows_its_cadence_program_verbatim(guide, program):
    assert (EXAMPLES / f"{program}.py").read_text() in python_blocks(GUIDES / guide)


@pytest.mark.parametrize("guide", PROGRAMS)
def test_each_guide_has_the_original_a_concept_table_and_the_differences(guide):
    text = (GUIDES / guide).read_text()
    assert len(python_blocks(GUIDES / guide)) >= 2  # the original program, then cadence's
    assert "| cadence |" in text.replace("`", "")
    assert "## Differences on purpose" in text


def test_orbit_program_trains_evaluates_and_continues(tmp_path):
    example = load("from_orbit")
    logs = example.main(str(tmp_path), train_steps=20)
    assert 0 <= logs["accuracy"] <= 1
    assert example.main(str(tmp_path), train_steps=20) == logs  # run again: finished
    assert example.main(str(tmp_path), train_steps=40) is not None  # from ckpt-20 on
    assert jsonl_steps(tmp_path / "eval" / "metrics.jsonl") == [20, 40]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["ckpt-20", "ckpt-40"]


@pytest.mark.parametrize("program", ["from_tf_model_garden", "from_lightning"])
def test_task_programs_train_export_the_best_and_resume(program, tmp_path):
    example = load(program)
    logs = example.main(str(tmp_path), train_steps=20)
    assert 0 <= logs["accuracy"] <= 1 and logs["best_accuracy"] == logs["accuracy"]
    assert (tmp_path / "best" / "info.json").is_file()
    assert (tmp_path / "checkpoints" / "ckpt-20").is_dir()
    # Run again: resumes, finds nothing to do, and returns the final evaluation's logs.
    assert example.main(str(tmp_path), train_steps=20) == logs
    assert jsonl_steps(tmp_path / "train" / "metrics.jsonl") == [20]
    assert jsonl_steps(tmp_path / "eval" / "metrics.jsonl") == [20]


def test_tensorpack_program_validates_keeps_the_best_and_resumes(tmp_path):
    example = load("from_tensorpack")
    results = example.main(str(tmp_path), max_epoch=1)
    assert set(results) == {"validation_cross_entropy_loss", "validation_accuracy"}
    # Run again: finished, and returns the last validation as the checkpoint kept it.
    assert example.main(str(tmp_path), max_epoch=1) == results
    example.main(str(tmp_path), max_epoch=2)  # resumes from the first epoch's checkpoint
    stats = [json.loads(line) for line in (tmp_path / "stats.jsonl").read_text().splitlines()]
    assert [s["epoch"] for s in stats] == [1, 2]
    resumes = (tmp_path / "resumes.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in resumes] == [stats[0]["global_step"]]
    assert list(tmp_path.glob("maxsaver-validation_accuracy/best-*/model.safetensors"))


def test_tfsnippet_program_logs_restores_the_best_and_resumes(tmp_path, capsys):
    example = load("from_tfsnippet")
    best = example.main(str(tmp_path), max_epoch=1)
    assert 0 <= best <= 1
    assert "[Step 23, ETA 0s]" in capsys.readouterr().out  # 1500 // 64 steps; one epoch
    example.main(str(tmp_path), max_epoch=2)
    out = capsys.readouterr().out
    assert "Resume training: epoch 1, step 23" in out and "[Epoch 2/2, Step 46" in out


def test_the_tf_model_garden_experiment_runs_from_its_file_by_the_command_the_guide_shows(
        tmp_path, monkeypatch, capsys, user_modules):
    from cadence.task.cli import main

    spelling = "examples/migrating/from_tf_model_garden.py:digits_mlp"
    guide = (GUIDES / "tf-model-garden.md").read_text()
    assert f"cadence train -e {spelling} -m runs/digits_mlp" in guide
    assert "cadence eval -m runs/digits_mlp --checkpoint best" in guide
    from cadence.task import registry

    # `load` above may have registered it from a module of its own (not in sys.modules).
    monkeypatch.delitem(registry._experiments, "digits_mlp", raising=False)
    monkeypatch.chdir(ROOT)  # (the run itself goes to tmp_path)
    run = str(tmp_path / "digits_mlp")
    fast = [f"trainer.{key}=10" for key in ("steps_per_loop", "validation_interval",
                                            "checkpoint_interval")]
    assert main(["train", "-e", spelling, "-m", run, "--no-progress", "--set",
                 "trainer.train_steps=20", *(a for key in fast for a in ("--set", key))]) == 0
    capsys.readouterr()
    assert main(["eval", "-m", run, "--checkpoint", "best"]) == 0  # no -e: params.yaml says
    assert "Evaluation: accuracy=" in capsys.readouterr().out
