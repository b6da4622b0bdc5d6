"""Every example runs on CPU in seconds."""

import importlib.util
import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_orbit_classifier_trains_checkpoints_summarizes_and_resumes(tmp_path):
    example = load("orbit_classifier")
    result = example.main(["--model-dir", str(tmp_path), "--train-steps", "400"])
    assert result["accuracy"] > 0.9
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-200", "ckpt-400"]
    lines = (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()
    evals = [json.loads(line) for line in lines]
    # Checkpoints due at an evaluation's step are written right after it (same weights).
    assert [(e["step"], e["checkpoint"]) for e in evals] == [(200, None), (400, None)]
    assert list((tmp_path / "train").glob("events.out.tfevents.*"))
    # The same command again resumes: nothing left to train, the final evaluation already ran
    # (its logs come back from the checkpoint; nothing is evaluated or recorded again).
    assert example.main(["--model-dir", str(tmp_path), "--train-steps", "400"]) == result
    assert (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines() == lines
    # A longer target continues from step 400.
    result = example.main(["--model-dir", str(tmp_path), "--train-steps", "500"])
    assert result is not None and (tmp_path / "checkpoints" / "ckpt-500").is_dir()


@pytest.mark.slow
def test_train_loop_example_trains_restores_the_best_and_resumes(tmp_path, capsys):
    example = load("train_loop_digits")
    result = example.main(["--model-dir", str(tmp_path), "--epochs", "6"])
    assert result["valid_acc"] == result["best_valid_acc"] > 0.9  # the best parameters are back
    out = capsys.readouterr().out
    assert "[Epoch 6/6, Step 138" in out and "Restored the early-stopping parameters" in out
    assert list((tmp_path / "summaries").glob("events.out.tfevents.*"))
    again = example.main(["--model-dir", str(tmp_path), "--epochs", "8"])  # two more epochs
    out = capsys.readouterr().out
    assert "Resume training: epoch 6, step 138" in out and "[Epoch 8/8, Step 184" in out
    assert again["best_valid_acc"] >= result["best_valid_acc"]
