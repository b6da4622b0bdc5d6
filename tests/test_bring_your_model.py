"""docs/bring_your_model.md: each example runs as the guide shows it, and its commands too."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import user_models

from cadence.engine.runtime import shutdown

GUIDE = Path(__file__).parent.parent / "docs" / "bring_your_model.md"


def block(title):
    """The guide's Python block whose first line is the comment `title`."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    (found,) = [code for code in blocks if code.startswith(f"# {title}")]
    return found


def run(title, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "bring_your_model"}
    try:
        exec(compile(block(title), str(GUIDE), "exec"), namespace)
    finally:
        shutdown()  # the process group of one that DDP and FSDP2 made
    return namespace


def need(*libraries):
    for library in libraries:
        try:
            getattr(user_models, f"import_{library}")()
        except ImportError:
            pytest.skip(f"{library} is not installed")


@pytest.mark.slow
def test_a_transformers_model_in_a_task_goes_back_out_to_from_pretrained_and_cadence_export(
        tmp_path, monkeypatch, capsys, user_modules):
    need("transformers")
    namespace = run("A transformers causal LM as the model of a Task.", tmp_path, monkeypatch)
    assert namespace["logs"]["validation_loss"] < 4.0  # it learns (ln 64 = 4.16 at chance)
    assert capsys.readouterr().out.startswith("validation loss ")
    back = run("The Llama of the first example, back in transformers.", tmp_path, monkeypatch)
    assert type(back["llama"]).__name__ == "LlamaForCausalLM"
    # The commands run as a user runs them: in a process of their own, where the task of the
    # script is not registered (the model cannot be built there): the config.json its best
    # export kept goes beside the weights, and from_pretrained opens either folder.
    commands = re.findall(r"^(cadence export [^#\n]*)", GUIDE.read_text(), re.M)
    assert len(commands) == 2
    for command in commands:
        done = subprocess.run([sys.executable, "-m", "cadence", *shlex.split(command)[1:]],
                              cwd=tmp_path, capture_output=True, text=True, timeout=200)
        assert done.returncode == 0, done.stderr
        assert "beside it config.json" in done.stdout
    from transformers import AutoModelForCausalLM

    for folder in ("llama-export", "llama-best"):
        assert type(AutoModelForCausalLM.from_pretrained(tmp_path / folder)).__name__ == \
            "LlamaForCausalLM"


@pytest.mark.slow
def test_a_timm_model_in_a_task(tmp_path, monkeypatch, capsys, user_modules):
    need("timm")
    namespace = run("A timm ConvNeXt as the model of a Task.", tmp_path, monkeypatch)
    assert 0 <= namespace["logs"]["accuracy"] <= 1
    assert (tmp_path / "runs" / "convnext" / "checkpoints" / "ckpt-10").is_dir()


@pytest.mark.slow
def test_a_transformers_model_in_a_standard_trainer(tmp_path, monkeypatch):
    need("transformers")
    namespace = run("A transformers T5 in a StandardTrainer of one's own.", tmp_path,
                    monkeypatch)
    assert namespace["trainer"].global_step == 16
    assert (tmp_path / "runs" / "t5" / "checkpoints" / "ckpt-16").is_dir()


@pytest.mark.slow
def test_a_timm_model_in_a_standard_trainer_goes_back_out_to_load_state_dict(
        tmp_path, monkeypatch):
    need("timm")
    namespace = run("A timm ViT in a StandardTrainer of one's own, evaluated and exported.",
                    tmp_path, monkeypatch)
    assert namespace["trainer"].global_step == 8
    back = run("The ViT of the last example, back in timm.", tmp_path, monkeypatch)
    assert back["best"].parent.name in ("best-4", "best-8")
