"""`cadence export`: a run's model, from any checkpoint -- a sharded (DCP) one consolidated --
as one safetensors file that safetensors alone reads; one line for what is not a checkpoint."""

import json
import os
import subprocess
import sys

import pytest
import torch

from cadence.task.cli import main

READ_WITHOUT_CADENCE = """
import json, sys
sys.modules["cadence"] = None  # any import of cadence fails
from safetensors.torch import load_file
weights = load_file(sys.argv[1])
print(json.dumps({name: tensor.double().sum().item() for name, tensor in weights.items()}))
"""


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """digits trained 4 steps under FSDP2 in one process: its checkpoint is DCP's shards; its
    best export, the same step's weights gathered from them."""
    run = tmp_path_factory.mktemp("export") / "run"
    assert main(["train", "-m", str(run), "--no-progress", "--set", "trainer.train_steps=4",
                 "--set", "trainer.steps_per_loop=2", "--set", "trainer.validation_interval=4",
                 "--set", "task.model.hidden_sizes=[8]", "--set", "runtime.strategy=fsdp2",
                 "--set", "runtime.device=cpu"]) == 0
    from cadence.engine.runtime import shutdown

    shutdown()
    assert (run / "checkpoints" / "ckpt-4" / "sharded" / ".metadata").is_file()
    return run


def sums_read_without_cadence(path):
    result = subprocess.run([sys.executable, "-c", READ_WITHOUT_CADENCE, str(path)],
                            capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_sharded_checkpoint_is_exported_whole_and_read_back_without_cadence(
        sharded_run, tmp_path, capsys):
    from safetensors.torch import load_file

    capsys.readouterr()
    assert main(["export", str(sharded_run), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Exported step 4 of {sharded_run / 'checkpoints' / 'ckpt-4'} (")
    assert sorted(os.listdir(tmp_path / "out")) == ["model.safetensors"]  # not transformers'
    gathered = load_file(str(sharded_run / "best" / "best-4" / "model.safetensors"))
    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(exported) == sorted(gathered) and exported
    for name, tensor in gathered.items():
        assert torch.equal(exported[name], tensor), name
    sums = sums_read_without_cadence(tmp_path / "out" / "model.safetensors")
    assert sums == {name: tensor.double().sum().item() for name, tensor in gathered.items()}


def test_the_best_export_or_a_checkpoint_by_its_path_are_exported_too(sharded_run, tmp_path,
                                                                      capsys):
    from safetensors.torch import load_file

    assert main(["export", str(sharded_run), "--checkpoint", "best", "--out",
                 str(tmp_path / "best")]) == 0
    checkpoint = sharded_run / "checkpoints" / "ckpt-4"
    assert main(["export", str(sharded_run), "--checkpoint", str(checkpoint), "--out",
                 str(tmp_path / "path")]) == 0
    best = load_file(str(tmp_path / "best" / "model.safetensors"))
    by_path = load_file(str(tmp_path / "path" / "model.safetensors"))
    assert all(torch.equal(best[name], by_path[name]) for name in best)
    assert "Exported step 4 of" in capsys.readouterr().out


def error_line(capsys, argv):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cadence: error: "), captured.err
    return lines[0]


def test_a_damaged_checkpoint_or_one_that_is_not_is_one_line_and_exit_status_2(
        sharded_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    shard = run / "checkpoints" / "ckpt-4" / "sharded" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    line = error_line(capsys, ["export", str(run), "--out", str(tmp_path / "out")])
    assert "__0_0.distcp" in line and "SHA-256" in line
    assert not (tmp_path / "out" / "model.safetensors").exists()
    (tmp_path / "empty").mkdir()
    line = error_line(capsys, ["export", str(run), "--checkpoint", str(tmp_path / "empty"),
                               "--out", str(tmp_path / "out")])
    assert "holds no weights" in line
    line = error_line(capsys, ["export", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])
    assert "holds no complete checkpoint" in line
    (tmp_path / "file").write_text("x")
    line = error_line(capsys, ["export", str(sharded_run), "--out", str(tmp_path / "file")])
    assert "is a file" in line


def test_links_inside_the_run_are_not_followed(sharded_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    best = run / "best" / "best-4"
    shutil.move(best, tmp_path / "elsewhere")
    best.symlink_to(tmp_path / "elsewhere")
    line = error_line(capsys, ["export", str(run), "--checkpoint", "best", "--out",
                               str(tmp_path / "out")])
    assert "is a symbolic link" in line


def test_a_run_whose_config_cannot_be_loaded_is_exported_as_saved_and_says_so(
        sharded_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    params = run / "params.yaml"
    params.write_text(params.read_text().replace("experiment: digits", "experiment: elsewhere"))
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("cadence export: the run's config cannot be loaded (Unknown "
                                   "experiment 'elsewhere'")
    assert "exported as saved, with the config.json of its best export where it has one" in \
        captured.err and "-e MODULE:NAME" in captured.err and "Exported step 4" in captured.out


def test_a_run_whose_model_cannot_be_built_gets_the_config_json_its_best_export_keeps(
        sharded_run, tmp_path, capsys):
    """A task defined in a script: the command line cannot build its model, but the best
    export kept the model's config.json beside its weights (a transformers model's)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    params = run / "params.yaml"
    params.write_text(params.read_text().replace("experiment: digits", "experiment: elsewhere"))
    config_json = '{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'
    (run / "best" / "best-4" / "config.json").write_text(config_json)
    for checkpoint in ("latest", "best"):
        out = tmp_path / checkpoint
        assert main(["export", str(run), "--checkpoint", checkpoint, "--out", str(out)]) == 0
        assert (out / "config.json").read_text() == config_json
        assert "beside it config.json" in capsys.readouterr().out
    (run / "best" / "best-4" / "config.json").write_text("not json")  # damaged: left out
    assert main(["export", str(run), "--out", str(tmp_path / "damaged")]) == 0
    assert not (tmp_path / "damaged" / "config.json").exists()


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    """digits trained 20 steps with an EMA of its weights, evaluated and exported at 20."""
    run = tmp_path_factory.mktemp("export-ema") / "run"
    assert main(["train", "-m", str(run), "--no-progress", "--set", "trainer.train_steps=20",
                 "--set", "trainer.steps_per_loop=10", "--set", "trainer.validation_interval=20",
                 "--set", "task.model.hidden_sizes=[8]", "--set", "trainer.ema.enabled=true",
                 "--set", "trainer.ema.decay=0.9"]) == 0
    return run


def test_an_ema_run_exports_the_weights_it_evaluates_and_says_so_raw_on_request(
        ema_run, tmp_path, capsys):
    from safetensors.torch import load_file

    from cadence.engine.exporter import read_weights

    checkpoint = ema_run / "checkpoints" / "ckpt-20"
    ema, trained = read_weights(checkpoint, "ema"), read_weights(checkpoint, "model")
    assert any(not torch.equal(ema[name], trained[name]) for name in ema)
    capsys.readouterr()
    outputs = {}
    for name, extra in (("latest", []), ("best", ["--checkpoint", "best"]),
                        ("raw", ["--raw"])):
        assert main(["export", str(ema_run), *extra, "--out", str(tmp_path / name)]) == 0
        outputs[name] = capsys.readouterr().out
    for name, expected in (("latest", ema), ("best", ema), ("raw", trained)):
        exported = load_file(str(tmp_path / name / "model.safetensors"))
        assert all(torch.equal(exported[key], expected[key]) for key in expected), name
    assert outputs["latest"].startswith(
        f"Exported the EMA weights (what the run evaluates) of step 20 of {checkpoint} (")
    assert outputs["best"].startswith("Exported the EMA weights (what the run evaluates) of")
    assert outputs["raw"].startswith(f"Exported step 20 of {checkpoint} (")
    line = error_line(capsys, ["export", str(ema_run), "--checkpoint", "best", "--raw",
                               "--out", str(tmp_path / "raw-best")])
    assert "holds the EMA average alone" in line and f"--checkpoint {checkpoint}" in line
