"""Models users already have -- transformers' causal LM (tied and untied) and encoder-decoder,
timm's ViT and ConvNeXt -- as the model of a `Task` and of a `StandardTrainer`, in one process,
DDP and FSDP2 (torchrun, 2 ranks, gloo), with activation checkpointing, per-block compile and
bf16; and their weights back out: the best export loads with ``load_state_dict(strict=True)``,
a transformers model's is a folder ``from_pretrained`` opens with the trained model's logits, and
``cadence export`` of an FSDP2 run is read back without cadence.

The models and tasks are tests/user_models.py; the torchrun job is tests/user_model_job.py.
transformers is a test extra (``pip install -e '.[dev]'``); timm, which needs a torchvision built
for the installed torch, is tested where it is installed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import user_models
from test_real_models import torchrun_command

import cadence
from cadence.engine.parallelize import find_repeated_blocks
from cadence.engine.runtime import shutdown

JOB = Path(__file__).parent / "user_model_job.py"
LIBRARY = {"llama": "transformers", "llama_untied": "transformers", "t5": "transformers",
           "vit": "timm", "convnext": "timm"}


def available(library):
    try:
        (user_models.import_timm if library == "timm" else user_models.import_transformers)()
    except ImportError:
        return False
    return True


def need(family):
    library = LIBRARY[family]
    if not available(library):
        pytest.skip(f"{library} is not installed (transformers: pip install -e '.[dev]'; timm: "
                    "pip install timm, with a torchvision built for this torch)")


def model_of(family):
    return user_models.build_hub_model(user_models.HubModelConfig(family=family))


def assert_loads_strictly(family, weights, expected=None):
    """A fresh model takes `weights` with ``load_state_dict(strict=True)``, tied as it ties."""
    fresh = model_of(family)
    fresh.load_state_dict(weights, strict=True)
    if family.startswith("llama"):
        tied = fresh.lm_head.weight is fresh.model.embed_tokens.weight
        assert tied == (family == "llama")
    for name, value in (expected or {}).items():
        assert torch.equal(fresh.state_dict()[name], value), name
    return fresh


@pytest.fixture
def one_process_group():
    yield
    shutdown()


@pytest.mark.parametrize(("family", "expected"), [
    ("llama", "model.layers.0-1 (LlamaDecoderLayer)"),
    ("t5", "encoder.block.0-1, decoder.block.0-1 (T5Block)"),
    ("vit", "blocks.0-1 (Block)"),
    ("convnext", "stages.0.blocks.0-1, stages.1.blocks.0-1, stages.2.blocks.0-1, "
                 "stages.3.blocks.0-1 (ConvNeXtBlock)"),
])
def test_the_repeated_blocks_of_each_library_are_found_wherever_they_are_nested(family, expected):
    need(family)
    from cadence.engine.parallelize import describe_blocks

    found = find_repeated_blocks(model_of(family))
    assert describe_blocks(found.names, found.blocks) == expected and not found.left_out


ONE_PROCESS = [
    ("llama", "fsdp2", ["runtime.activation_checkpointing=true", "runtime.fsdp.param_dtype=bf16"]),
    ("llama_untied", "none", ["runtime.mixed_precision=bf16"]),
    ("t5", "ddp", ["runtime.activation_checkpointing=true"]),
    ("vit", "fsdp2", ["runtime.activation_checkpointing=true", "runtime.mixed_precision=bf16"]),
    ("convnext", "ddp", ["runtime.activation_checkpointing=true"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "strategy", "settings"), ONE_PROCESS)
def test_each_model_trains_as_a_tasks_model_in_one_process(family, strategy, settings, tmp_path,
                                                           one_process_group, caplog):
    """Dict batches in, the model's ``ModelOutput`` (and its own loss) to build_losses; the
    best export loads strictly by the model's own names."""
    need(family)
    config = cadence.load_config(f"hub_{family}", overrides=[f"runtime.strategy={strategy}",
                                                             *settings])
    run = tmp_path / "run"
    with caplog.at_level("INFO", logger="cadence"):
        _, logs = cadence.run_experiment(config, "train_and_eval", run)
    assert (run / "checkpoints" / "ckpt-4").is_dir()
    assert torch.isfinite(torch.tensor(logs["validation_loss"]))
    plan = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Parallelized")]
    if strategy != "none" or "activation_checkpointing" in " ".join(settings):
        assert len(plan) == 1 and f"({strategy})" in plan[0], plan
    from safetensors.torch import load_file

    best = json.loads((run / "best" / "info.json").read_text())["exports"][0]["path"]
    assert_loads_strictly(family, load_file(str(run / "best" / best / "model.safetensors")))


@pytest.mark.slow
@pytest.mark.parametrize(("family", "strategy"), [("llama", "fsdp2"), ("convnext", "none")])
def test_each_model_trains_as_a_standard_trainers_model_in_one_process(family, strategy,
                                                                       tmp_path,
                                                                       one_process_group):
    need(family)
    from safetensors.torch import load_file

    options = cadence.ParallelOptions(activation_checkpointing=True)
    runner = user_models.train_runner(family, strategy, tmp_path, steps=4, options=options)
    assert runner.global_step == 4
    assert_loads_strictly(family, load_file(str(runner.exporter.best_ckpt_path)))


@pytest.mark.slow
def test_a_transformers_models_blocks_compile(tmp_path, one_process_group):
    """``trainer.compile_blocks``: each decoder layer compiled in place, under FSDP2 (a
    compile on a CPU takes seconds: one small model)."""
    need("llama")
    config = cadence.load_config("hub_llama", overrides=[
        "runtime.strategy=fsdp2", "trainer.compile_blocks=true", "trainer.train_steps=2",
        "trainer.validation_interval=2"])
    model, logs = cadence.run_experiment(config, "train_and_eval", tmp_path / "run")
    assert all(layer._compiled_call_impl is not None for layer in model.model.layers)
    assert (tmp_path / "run" / "checkpoints" / "ckpt-2").is_dir()
    assert torch.isfinite(torch.tensor(logs["validation_loss"]))


# ---------------------------------------------------------------------------- torchrun, 2 ranks

FSDP2_END_AT_4 = "trainer.validation_interval=4"
"""One evaluation, at the end: the best export is the end's weights."""


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One torchrun job of 2 ranks training each model in turn: Tasks under FSDP2 (activation
    checkpointing, bf16 parameters) and DDP, StandardTrainers under FSDP2 and DDP."""
    if not available("transformers"):
        pytest.skip("transformers is not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("two-ranks")
    specs = [f"task:hub_llama:fsdp2:runtime.activation_checkpointing=true,"
             f"runtime.fsdp.param_dtype=bf16,{FSDP2_END_AT_4}",
             f"task:hub_llama_untied:fsdp2:{FSDP2_END_AT_4}",
             "task:hub_t5:ddp:runtime.activation_checkpointing=true",
             "runner:llama:fsdp2"]
    if available("timm"):
        specs += [f"task:hub_vit:fsdp2:runtime.activation_checkpointing=true,{FSDP2_END_AT_4}",
                  "task:hub_convnext:ddp", "runner:vit:fsdp2"]
    result = subprocess.run([*torchrun_command(2), str(JOB), str(out), *specs],
                            cwd=out, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return out


def end_state(out, name):
    state = torch.load(out / f"{name}-end.pt", weights_only=True)
    assert state["step"] == 4
    return state["model"]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("family", ["llama", "llama_untied", "vit"])
def test_the_best_export_of_an_fsdp2_task_loads_strictly_with_the_trained_weights(two_ranks,
                                                                                  family):
    need(family)
    from safetensors.torch import load_file

    run = two_ranks / f"hub_{family}-fsdp2"
    trained = end_state(two_ranks, f"hub_{family}-fsdp2")
    exported = load_file(str(run / "best" / "best-4" / "model.safetensors"))
    assert sorted(exported) == sorted(trained)
    assert_loads_strictly(family, exported, trained)
    log = (two_ranks / "log-0.txt").read_text()
    assert "Parallelized (fsdp2): FSDP2 units model.layers.0-1 (LlamaDecoderLayer)" in log
    assert "Parallelized" not in (two_ranks / "log-1.txt").read_text()  # rank 0 says it


@pytest.mark.slow
@pytest.mark.distributed
def test_a_transformers_models_export_is_a_folder_from_pretrained_opens_with_its_logits(
        two_ranks, tmp_path):
    need("llama")
    from transformers import AutoModelForCausalLM

    trained = assert_loads_strictly("llama", end_state(two_ranks, "hub_llama-fsdp2"))
    export = two_ranks / "hub_llama-fsdp2" / "best" / "best-4"
    assert {"config.json", "model.safetensors"} <= set(os.listdir(export))
    assert json.loads((export / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"]  # the user's class, not FSDP2's FSDPLlamaForCausalLM
    loaded = AutoModelForCausalLM.from_pretrained(export)
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.arange(1, 13).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids).logits, trained.eval()(ids).logits)


READ_WITHOUT_CADENCE = """
import json, sys
sys.modules["cadence"] = None  # any import of cadence fails
from safetensors.torch import load_file
weights = load_file(sys.argv[1])
print(json.dumps({name: tensor.double().sum().item() for name, tensor in weights.items()}))
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_cadence_export_of_an_fsdp2_run_is_read_back_without_cadence(two_ranks, tmp_path,
                                                                    capsys):
    need("llama")
    from transformers import AutoModelForCausalLM

    from cadence.task.cli import main

    run = two_ranks / "hub_llama-fsdp2"
    assert (run / "checkpoints" / "ckpt-4" / "sharded" / ".metadata").is_file()  # DCP's shards
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 0
    assert "beside it config.json" in capsys.readouterr().out
    result = subprocess.run([sys.executable, "-c", READ_WITHOUT_CADENCE,
                             str(tmp_path / "out" / "model.safetensors")],
                            capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    trained = end_state(two_ranks, "hub_llama-fsdp2")
    assert json.loads(result.stdout) == {
        name: tensor.double().sum().item() for name, tensor in trained.items()}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, trained[name]), name


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(("name", "family"), [("hub_t5-ddp", "t5"),
                                              ("hub_convnext-ddp", "convnext")])
def test_ddp_tasks_train_to_the_end_and_export_their_best(two_ranks, name, family):
    need(family)
    from safetensors.torch import load_file

    trained = end_state(two_ranks, name)
    best = json.loads((two_ranks / name / "best" / "info.json").read_text())["exports"][0]
    assert_loads_strictly(family, load_file(str(
        two_ranks / name / "best" / best["path"] / "model.safetensors")))
    assert all(torch.isfinite(value).all() for value in trained.values())


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("family", ["llama", "vit"])
def test_a_standard_trainer_exports_its_fsdp2_models_whole_weights(two_ranks, family):
    """The runner hands its sharded model to the exporter on every rank: the weights are
    gathered, rank 0 writes them."""
    need(family)
    from safetensors.torch import load_file

    name = f"runner-{family}-fsdp2"
    exported = load_file(str(two_ranks / name / "best" / "best-4" / "model.safetensors"))
    assert_loads_strictly(family, exported, end_state(two_ranks, name))
