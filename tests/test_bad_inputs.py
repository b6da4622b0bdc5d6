"""A sweep of bad inputs, each one a mistake a user can make: every one is refused in one clear
line -- ``cadence: error: <the problem and the fix>`` and exit status 2 at the command line, one
exception with a one-line message in Python -- and nothing is lost or written anywhere: the
working directory, a finished run in it and a folder beside it are byte for byte what they were.

The front-ends' own schedules (tensorpack's ``TrainConfig`` and callbacks, tfsnippet's
``TrainLoop``) are swept in their own test files; a few of each are here too.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from disks import fill, small_tmpfs
from fakes import (
    USER_MODELS,
    CountingTrainer,
    TinyClassifier,
    make_classification,
    make_loader,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cadence
from cadence import (
    BestCheckpointExporter,
    CheckpointManager,
    ConfigError,
    Controller,
    DataConfig,
    StandardTrainerOptions,
    TrainLoop,
    load_config,
    load_weights,
    run_experiment,
)
from cadence.callbacks import EarlyStopping
from cadence.core.errors import HookTypeError, HookValueError
from cadence.engine.runtime import local_device
from cadence.engine.stop_agreement import StopAgreement
from cadence.task.cli import main
from cadence.task.config_files import load_run_config

FAST = ["--no-progress", "--set", "trainer.train_steps=20", "--set", "trainer.steps_per_loop=10",
        "--set", "trainer.validation_interval=10", "--set", "trainer.checkpoint_interval=10",
        "--set", "task.model.hidden_sizes=[16]"]
OPT = "trainer.optimizer_config.optimizer"
LR = "trainer.optimizer_config.learning_rate"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished digits run, made once and copied into each case's working directory."""
    root = tmp_path_factory.mktemp("template")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert main(["train", "-m", "good", *FAST]) == 0
    return root / "good"


@pytest.fixture
def workdir(tmp_path, monkeypatch, finished_run, user_modules):
    """The working directory: a file, a folder of someone else's files, and a finished run.
    A user's module a case writes and imports is forgotten after it (`user_modules`)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file.txt").write_text("not a run")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "notes.txt").write_text("someone else's")
    shutil.copytree(finished_run, tmp_path / "runs" / "good")
    return tmp_path


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under `root`, with the SHA-256 of each file."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                       if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


def one_clear_line(capsys, argv: list[str]) -> str:
    """Runs ``cadence`` with `argv`; checks exit 2 and one ``cadence: error:`` line, no
    traceback; returns the line."""
    status = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2, err
    assert err and err[-1].startswith("cadence: error: "), err
    assert not any("Traceback" in line for line in err), err
    return err[-1]


def mkdir(*paths: str):
    return lambda root: [(root / p).mkdir(parents=True) for p in paths]


def touch(*paths: str):
    def make(root: Path) -> None:
        for p in paths:
            (root / p).parent.mkdir(parents=True, exist_ok=True)
            (root / p).write_text("x")
    return make


def write(path: str, text: str):
    return lambda root: (root / path).write_text(text)


def nothing(root: Path) -> None:
    pass


user_module = write("mymodels.py", USER_MODELS.format(module="mymodels",
                                                      experiment="my_experiment"))
"""A user's module of experiments in the working directory (tests/fakes.py)."""


def cut(lines: int | None = None, inside: str = "", path: str = "runs/good/params.yaml"):
    """Cuts the file short after its first `lines` lines, or in the middle of the first line
    that starts with `inside`."""
    def make(root: Path) -> None:
        text = (root / path).read_text()
        (root / path).write_text("".join(text.splitlines(True)[:lines]) if lines is not None
                                 else text[:text.index(f"\n{inside}") + len(inside) // 2])
    return make


def without(section: str, path: str = "runs/good/params.yaml"):
    """Removes the lines of the YAML block that starts with the line `section`."""
    def make(root: Path) -> None:
        lines = (root / path).read_text().splitlines(True)
        start = lines.index(section + "\n")
        depth = len(section) - len(section.lstrip())
        end = next(i for i in range(start + 1, len(lines))
                   if len(lines[i]) - len(lines[i].lstrip()) <= depth)
        (root / path).write_text("".join(lines[:start] + lines[end:]))
    return make


def records(module: str, payload: str | None = None, run: str = "runs/good"):
    """Makes the run's params.yaml record `module` as its experiment's; with `payload`, a file
    of the run that leaves a mark if it is ever run."""
    def make(root: Path) -> None:
        params = root / run / "params.yaml"
        params.write_text(re.sub(r"(?m)^experiment_module: .*$", f"experiment_module: {module}",
                                 params.read_text()))
        if payload is not None:
            (root / run / payload).write_text("open('PAYLOAD_RAN', 'w').close()\n")
    return make


HOOK_MISTAKES = '''

# Tasks whose hooks return what cadence cannot use: one experiment each.


def with_task(task):
    config = make_config()
    config.task = task
    return config


@dataclass
class NoModelConfig(BlobsConfig):
    pass


@cadence.register_task(NoModelConfig)
class NoModel(Blobs):
    def build_model(self):
        return "a model"


def no_model():
    return with_task(NoModelConfig())


@dataclass
class NoInputsConfig(BlobsConfig):
    pass


@cadence.register_task(NoInputsConfig)
class NoInputs(Blobs):
    def build_inputs(self, params, input_context=None):
        return None


def no_inputs():
    return with_task(NoInputsConfig())


@dataclass
class NoValidationBatchConfig(BlobsConfig):
    pass


@cadence.register_task(NoValidationBatchConfig)
class NoValidationBatch(Blobs):
    def build_inputs(self, params, input_context=None):
        if params.is_training:
            return super().build_inputs(params, input_context)
        return (batch for batch in [])  # a generator that yields nothing


def no_validation_batch():
    return with_task(NoValidationBatchConfig())


@dataclass
class MetricIsANumberConfig(BlobsConfig):
    pass


@cadence.register_task(MetricIsANumberConfig)
class MetricIsANumber(Blobs):
    def build_metrics(self, training=True):
        return {"accuracy": 0.5}


def metric_is_a_number():
    return with_task(MetricIsANumberConfig())


@dataclass
class MetricsAreANumberConfig(BlobsConfig):
    pass


@cadence.register_task(MetricsAreANumberConfig)
class MetricsAreANumber(Blobs):
    def build_metrics(self, training=True):
        return 0.5


def metrics_are_a_number():
    return with_task(MetricsAreANumberConfig())


@dataclass
class LossPerExampleConfig(BlobsConfig):
    pass


@cadence.register_task(LossPerExampleConfig)
class LossPerExample(Blobs):
    def build_losses(self, labels, model_outputs, aux_losses=None):
        return nn.functional.cross_entropy(model_outputs, labels, reduction="none")


def loss_per_example():
    return with_task(LossPerExampleConfig())


@dataclass
class TrainsNothingConfig(BlobsConfig):
    pass


@cadence.register_task(TrainsNothingConfig)
class TrainsNothing(Blobs):
    def train_step(self, inputs, model, optimizer, metrics=None):
        logs = super().train_step(inputs, model, optimizer, metrics)
        return {self.loss: logs[self.loss].detach()}


def trains_nothing():
    return with_task(TrainsNothingConfig())
'''
"""Experiments of tasks whose hooks return what cadence cannot use: the build hooks' refused
when the Trainer is built (before anything is written), the steps' at the first step."""

hook_mistakes = write("hooks.py", USER_MODELS.format(module="hooks", experiment="hooks_ok")
                      + HOOK_MISTAKES)


def ledger_entry(**values):
    """Sets fields of the best export in the finished run's ledger (best/info.json)."""
    def make(root: Path) -> None:
        path = root / "runs/good/best/info.json"
        ledger = json.loads(path.read_text())
        ledger["exports"][0].update(values)
        path.write_text(json.dumps(ledger))
    return make


# (what the user did, setup of the working directory, the command line, what the line says)
COMMAND_LINE = [
    # -- values out of range, at the command line
    ("negative end factor", nothing, ["train", *FAST, "--set", f"{LR}.schedule=linear",
                                      "--set", f"{LR}.end_factor=-2"],
     r"end_factor: must be a factor in \[0, 1\].*\(got -2"),
    ("end factor above 1", nothing, ["train", *FAST, "--set", f"{LR}.end_factor=1.5"],
     r"end_factor: must be a factor in \[0, 1\]"),
    ("negative warmup factor", nothing, ["train", *FAST, "--set", f"{LR}.warmup_steps=5",
                                         "--set", f"{LR}.warmup_init_factor=-3"],
     r"warmup_init_factor: must be a factor in \[0, 1\]"),
    ("negative step gamma", nothing, ["train", *FAST, "--set", f"{LR}.schedule=step",
                                      "--set", f"{LR}.gamma=-1"],
     r"gamma: must be a positive finite number \(the learning rate is multiplied by it"),
    ("zero exponential gamma", nothing, ["train", *FAST, "--set", f"{LR}.schedule=exponential",
                                         "--set", f"{LR}.gamma=0"], r"gamma: must be a positive"),
    ("zero step size", nothing, ["train", *FAST, "--set", f"{LR}.step_size=0"],
     r"step_size: must be a positive integer \(got 0\)"),
    ("negative warmup steps", nothing, ["train", *FAST, "--set", f"{LR}.warmup_steps=-1"],
     r"warmup_steps: must be an integer >= 0"),
    ("zero decay steps", nothing, ["train", *FAST, "--set", f"{LR}.decay_steps=0"],
     r"decay_steps: must be a positive integer or null"),
    ("unknown schedule", nothing, ["train", *FAST, "--set", f"{LR}.schedule=cosin"],
     r"unknown schedule 'cosin'; valid: constant, cosine"),
    ("zero learning rate", nothing, ["train", *FAST, "--set", f"{OPT}.learning_rate=0"],
     r"optimizer.learning_rate: must be a positive finite number \(got 0.0\)"),
    ("infinite learning rate", nothing, ["train", *FAST, "--set", f"{OPT}.learning_rate=.inf"],
     r"optimizer.learning_rate: must be a positive finite number \(got inf\)"),
    ("NaN learning rate", nothing, ["train", *FAST, "--set", f"{OPT}.learning_rate=.nan"],
     r"optimizer.learning_rate: must be a positive finite number \(got nan\)"),
    ("a learning rate as a word", nothing, ["train", *FAST, "--set", f"{OPT}.learning_rate=fast"],
     r"learning_rate.*could not be converted to Float"),
    ("one beta", nothing, ["train", *FAST, "--set", f"{OPT}.betas=[0.9]"],
     r"betas: must be a pair of numbers in \[0, 1\)"),
    ("a beta of 1.2", nothing, ["train", *FAST, "--set", f"{OPT}.betas=[1.2,0.9]"],
     r"betas: must be a pair of numbers in \[0, 1\).*\(got \[1.2, 0.9\]\)"),
    ("three betas", nothing, ["train", *FAST, "--set", f"{OPT}.betas=[0.9,0.99,0.999]"],
     r"betas: must be a pair"),
    ("zero eps", nothing, ["train", *FAST, "--set", f"{OPT}.eps=0"],
     r"eps: must be a positive finite number \(it keeps an update finite"),
    ("negative momentum", nothing, ["train", *FAST, "--set", f"{OPT}.name=sgd",
                                    "--set", f"{OPT}.momentum=-1"],
     r"momentum: must be a finite number >= 0 \(got -1.0\)"),
    ("negative weight decay", nothing, ["train", *FAST, "--set", f"{OPT}.weight_decay=-0.1"],
     r"weight_decay: must be a finite number >= 0"),
    ("unknown optimizer", nothing, ["train", *FAST, "--set", f"{OPT}.name=lion"],
     r"unknown optimizer 'lion'; valid: sgd, adam, adamw"),
    ("a zero clip norm", nothing, ["train", *FAST, "--set",
                                   "trainer.optimizer_config.gradient_clip_norm=0"],
     r"gradient_clip_norm: must be a positive finite number or null \(null: no clipping\)"),
    ("zero accumulation steps", nothing, ["train", *FAST, "--set",
                                          "trainer.optimizer_config.gradient_accumulation_steps=0"],
     r"gradient_accumulation_steps: must be a positive integer"),
    ("a negative seed", nothing, ["train", *FAST, "--set", "runtime.seed=-1"],
     r"runtime.seed: must be an integer in \[0, 2\*\*32\) or null \(got -1\)"),
    ("a seed too large", nothing, ["train", *FAST, "--set", "runtime.seed=4294967296"],
     r"runtime.seed: must be an integer in \[0, 2\*\*32\)"),
    ("a negative data seed", nothing, ["train", *FAST, "--set", "task.train_data.seed=-4"],
     r"task.train_data.seed: must be an integer in \[0, 2\*\*32\) or null"),
    ("a negative split seed", nothing, ["train", *FAST, "--set", "task.split_seed=-4"],
     r"task.split_seed: must be an integer in \[0, 2\*\*32\)"),
    ("a validation fraction of 0", nothing, ["train", *FAST, "--set",
                                              "task.validation_fraction=0"],
     r"task.validation_fraction: must be a fraction in \(0, 1\)"),
    ("a negative validation fraction", nothing, ["train", *FAST, "--set",
                                                  "task.validation_fraction=-0.2"],
     r"task.validation_fraction: must be a fraction in \(0, 1\).*\(got -0.2\)"),
    ("a validation fraction of 1.5", nothing, ["train", *FAST, "--set",
                                                "task.validation_fraction=1.5"],
     r"task.validation_fraction: must be a fraction in \(0, 1\).*\(got 1.5\)"),
    ("a char_lm validation fraction of 1", nothing,
     ["train", "-e", "char_lm", *FAST[:9], "--set", "task.validation_fraction=1"],
     r"task.validation_fraction: must be a fraction in \(0, 1\) \(the share of the text"),
    ("a gpt of no bytes", nothing, ["train", "-e", "gpt", *FAST[:9], "--set", "task.max_bytes=0"],
     r"task.max_bytes: must be a positive integer \(got 0\)"),
    ("an EMA decay of 1", nothing, ["train", *FAST, "--set", "trainer.ema.enabled=true",
                                    "--set", "trainer.ema.decay=1.0"],
     r"trainer.ema.decay: must be in \[0, 1\) \(got 1.0\)"),
    ("a negative EMA start", nothing, ["train", *FAST, "--set", "trainer.ema.start_step=-3"],
     r"trainer.ema.start_step: must be an integer >= 0 \(got -3\)"),
    ("negative recovery start", nothing, ["train", *FAST, "--set",
                                          "trainer.recovery_begin_steps=-1"],
     r"recovery_begin_steps: must be an integer >= 0"),
    ("recovery trials of -2", nothing, ["train", *FAST, "--set",
                                        "trainer.recovery_max_trials=-2"],
     r"recovery_max_trials: must be -1 \(ignore\), 0 \(fail\) or a positive number"),
    ("a NaN loss bound", nothing, ["train", *FAST, "--set", "trainer.loss_upper_bound=.nan"],
     r"loss_upper_bound: must be >= 0 \(a larger mean training loss is a blow-up"),
    ("a negative eval timeout", nothing, ["train", *FAST, "--set",
                                          "trainer.continuous_eval_timeout=-1"],
     r"continuous_eval_timeout: must be a finite number >= 0 or null"),
    ("a zero collective timeout", nothing, ["train", *FAST, "--set",
                                            "runtime.collective_timeout=0"],
     r"runtime.collective_timeout: must be a positive finite number \(seconds"),
    ("zero threads", nothing, ["train", *FAST, "--set", "runtime.num_threads=0"],
     r"runtime.num_threads: must be a positive integer or null"),
    ("zero validation steps", nothing, ["train", *FAST, "--set", "trainer.validation_steps=0"],
     r"validation_steps: must be positive, or -1 for the whole validation set"),
    ("zero checkpoints kept", nothing, ["train", *FAST, "--set", "trainer.max_to_keep=0"],
     r"trainer.max_to_keep: must be a positive integer \(got 0\)"),
    ("zero best exports kept", nothing, ["train", *FAST, "--set",
                                         "trainer.best_checkpoint_max_to_keep=0"],
     r"best_checkpoint_max_to_keep: must be a positive integer"),
    ("best metric compared 'bigger'", nothing, ["train", *FAST, "--set",
                                                "trainer.best_checkpoint_metric_comp=bigger"],
     r"best_checkpoint_metric_comp: must be 'higher' or 'lower' \(got 'bigger'\)"),
    ("zero summary interval", nothing, ["train", *FAST, "--set", "trainer.summary_interval=0"],
     r"summary_interval: must be a positive integer or null \(null: every step\)"),
    ("a negative checkpoint interval", nothing, ["train", *FAST, "--set",
                                                 "trainer.checkpoint_interval=-10"],
     r"checkpoint_interval: must be a positive integer or null \(null: only at the end\)"),
    ("zero validation interval", nothing, ["train", *FAST, "--set",
                                           "trainer.validation_interval=0"],
     r"validation_interval: must be a positive integer"),
    ("negative workers", nothing, ["train", *FAST, "--set", "task.train_data.num_workers=-1"],
     r"task.train_data.num_workers: must be an integer >= 0 \(0: load in the main process\)"),
    ("zero validation batch", nothing, ["train", *FAST, "--set",
                                        "task.validation_data.global_batch_size=0"],
     r"task.validation_data.global_batch_size: must be a positive integer"),
    ("unknown precision", nothing, ["train", *FAST, "--set", "runtime.mixed_precision=fp8"],
     r"runtime.mixed_precision: must be null, 'bf16' or 'fp16' \(got 'fp8'\)"),
    ("unknown strategy", nothing, ["train", *FAST, "--set", "runtime.strategy=zero3"],
     r"runtime.strategy: must be one of auto, none, ddp, fsdp2"),
    ("unknown FSDP dtype", nothing, ["train", *FAST, "--set", "runtime.fsdp.param_dtype=int8"],
     r"runtime.fsdp.param_dtype: must be null, 'bf16', 'fp16', 'fp32'"),
    ("unknown writer", nothing, ["train", *FAST, "--set", "runtime.writers=[tensorbord]"],
     r"runtime.writers: unknown writer 'tensorbord'; valid:"),
    ("unknown compile mode", nothing, ["train", *FAST, "--set", "trainer.compile_mode=fastest"],
     r"trainer.compile_mode: unknown mode 'fastest'"),
    ("both compile options", nothing, ["train", *FAST, "--set", "trainer.compile_step=true",
                                       "--set", "trainer.compile_blocks=true"],
     r"set one of them, not both"),
    ("tensor parallelism over more ranks than the job has", nothing,
     ["train", *FAST, "--set", "runtime.parallelism.tp=2"],
     r"runtime.parallelism: pp=1 x dp_replicate=1 x dp_shard=-1 x cp=1 x tp=2 leaves no whole "
     r"dp_shard for 1 process: .* = 2 must divide the world size"),
    ("an uncatchable Slurm stop signal", nothing, ["train", *FAST, "--set",
                                                   "runtime.slurm.signal=SIGKILL"],
     r"runtime.slurm.signal: The Slurm stop signal \(got 'SIGKILL'\) must be the name of a "
     r"signal that can be caught"),
    ("CUDA graphs on a CPU", nothing, ["train", *FAST, "--set", "runtime.device=cpu",
                                       "--set", "trainer.cuda_graphs=true"],
     r"trainer.cuda_graphs is true but the device is cpu.*Set trainer.cuda_graphs=false"),
    # -- early stopping, the time limit, the profiler
    ("zero early-stopping patience", nothing, ["train", *FAST, "--set",
                                               "trainer.early_stopping.patience=0"],
     r"trainer.early_stopping.patience: must be a positive integer \(evaluations without"),
    ("a negative early-stopping delta", nothing, ["train", *FAST, "--set",
                                                  "trainer.early_stopping.min_delta=-1"],
     r"trainer.early_stopping.min_delta: must be a finite number >= 0 \(got -1.0\)"),
    ("early stopping 'up'", nothing, ["train", *FAST, "--set", "trainer.early_stopping.mode=up"],
     r"trainer.early_stopping.mode: must be null, 'min' or 'max' \(got 'up'\)"),
    ("early stopping on a metric not reported", nothing,
     ["train", *FAST, "--set", "trainer.early_stopping.monitor=acuracy"],
     r"trainer.early_stopping.monitor \(got 'acuracy'\) is not a metric.*accuracy"),
    ("early stopping without evaluations", nothing,
     ["train", *FAST, "--mode", "train", "--set", "trainer.early_stopping.monitor=accuracy"],
     r"mode 'train' has none: run train_and_eval"),
    ("a zero time limit", nothing, ["train", *FAST, "--set", "trainer.time_limit=0"],
     r"trainer.time_limit: must be a positive number of seconds, or 'HH:MM:SS'.*\(got 0\)"),
    ("a time limit in minutes", nothing, ["train", *FAST, "--set", "trainer.time_limit=90m"],
     r"trainer.time_limit: must be a positive number of seconds.*\(got '90m'\)"),
    ("a profiler of no active steps", nothing, ["train", *FAST, "--set",
                                                "runtime.profiler.active=0"],
     r"runtime.profiler.active: must be a positive integer \(steps recorded"),
    ("a negative profiler wait", nothing, ["train", *FAST, "--set", "runtime.profiler.wait=-1"],
     r"runtime.profiler.wait: must be an integer >= 0 \(got -1\)"),
    # -- where the run writes
    ("eval summaries outside the run", nothing, ["train", *FAST, "--set",
                                                 "trainer.validation_summary_subdir=../x"],
     r"validation_summary_subdir: must be a relative path inside the run directory"),
    ("eval summaries at an absolute path", nothing,
     ["train", *FAST, "--set", "trainer.validation_summary_subdir=/tmp/eval"],
     r"validation_summary_subdir: must be a relative path inside the run"),
    ("best exports at an absolute path", nothing,
     ["train", *FAST, "--set", "trainer.best_checkpoint_export_subdir=/tmp/best"],
     r"best_checkpoint_export_subdir: must be a relative path inside the run directory, or ''"),
    ("best exports in the checkpoints", nothing,
     ["train", *FAST, "--set", "trainer.best_checkpoint_export_subdir=checkpoints"],
     r"best_checkpoint_export_subdir: 'checkpoints' is where the run keeps its own files"),
    ("eval summaries into the training ones", nothing,
     ["train", *FAST, "--set", "trainer.validation_summary_subdir=train"],
     r"validation_summary_subdir: 'train' is where the run keeps its own files"),
    # -- the run directory
    ("an empty -m", nothing, ["train", *FAST, "-m", ""],
     r"argument --model-dir/-m: is empty; pass the directory of a run"),
    ("an empty -m to eval", nothing, ["eval", "-m", ""], r"--model-dir/-m: is empty"),
    ("-m naming a file", nothing, ["train", *FAST, "-m", "a_file.txt"],
     r"--model-dir 'a_file.txt' is a file"),
    ("-m the current directory of other files", nothing, ["train", *FAST, "-m", "."],
     r"'\.' holds other runs \(runs\)|'\.' holds files that are not a run's"),
    ("-m a folder of someone else's files", nothing, ["train", *FAST, "-m", "elsewhere"],
     r"'elsewhere' holds files that are not a run's \(notes.txt\).*pass a new or empty "
     r"directory"),
    ("-m the folder of runs", nothing, ["train", *FAST, "-m", "runs"],
     r"'runs' holds other runs \(good\): pass one of them"),
    ("-m inside a run", nothing, ["train", *FAST, "-m", "runs/good/checkpoints"],
     r"'runs/good/checkpoints' is inside the run directory 'runs/good': pass that run itself "
     r"\(--model-dir runs/good\)"),
    ("-m deeper inside a run", nothing, ["train", *FAST, "-m", "runs/good/train/new"],
     r"is inside the run directory 'runs/good'"),
    ("params.yaml a directory", mkdir("run/params.yaml"), ["train", *FAST, "-m", "run"],
     r"'run/params.yaml' is a directory where cadence keeps its params.yaml file"),
    ("train.lock a directory", mkdir("run/train.lock"), ["train", *FAST, "-m", "run"],
     r"'run/train.lock' is a directory"),
    ("checkpoints a file", touch("run/checkpoints"), ["train", *FAST, "-m", "run"],
     r"'run/checkpoints' is a file where cadence keeps its checkpoints directory"),
    ("train summaries a file", touch("run/train"), ["train", *FAST, "-m", "run"],
     r"'run/train' is a file where cadence keeps its train directory"),
    ("eval summaries a file", touch("run/eval"), ["train", *FAST, "-m", "run"],
     r"'run/eval' is a file where cadence keeps its eval directory"),
    ("best exports a file", touch("run/best"), ["train", *FAST, "-m", "run"],
     r"'run/best' is a file where cadence keeps its best directory"),
    ("eval of a checkpoint", nothing, ["eval", "-m", "runs/good/checkpoints/ckpt-20"],
     r"is a checkpoint, not a run: pass the run directory that holds it \(--model-dir "
     r"runs/good\)"),
    ("eval of the checkpoints folder", nothing, ["eval", "-m", "runs/good/checkpoints"],
     r"is inside the run directory 'runs/good'"),
    ("eval of a file", nothing, ["eval", "-m", "a_file.txt"], r"is a file"),
    ("eval of a folder that does not exist", nothing, ["eval", "-m", "nowhere"],
     r"'nowhere' does not exist"),
    ("eval of someone else's files", nothing, ["eval", "-m", "elsewhere"],
     r"'elsewhere' has no checkpoint to evaluate"),
    # -- a run's config
    ("a changed config", nothing, ["train", "-m", "runs/good", "--set",
                                   "task.model.dropout=0.3"],
     r"holds a run with a different config \(task.model.dropout: 0.1 -> 0.3\).*"
     r"--allow-config-change"),
    ("another experiment in a run", nothing, ["train", "-m", "runs/good", "-e", "char_lm"],
     r"holds a run with a different config"),
    ("a bad value on a run", nothing, ["train", "-m", "runs/good", "--set", "runtime.seed=-2"],
     r"runtime.seed: must be an integer in \[0, 2\*\*32\)"),
    # -- a run's params.yaml: whole, as save_config wrote it
    ("params.yaml cut in half", cut(lines=60), ["train", "-m", "runs/good"],
     r"^cadence: error: 'runs/good/params.yaml' is not a whole config of experiment 'digits': "
     r"it lacks .* \(was it cut short\?\)\. Restore it from a copy, or move it aside and run "
     r"again with the experiment, config files and --set values the run was started with "
     r"\(its checkpoints are kept\)\.$"),
    ("eval of a params.yaml cut in half", cut(lines=60), ["eval", "-m", "runs/good"],
     r"'runs/good/params.yaml' is not a whole config of experiment 'digits': it lacks"),
    ("config of a params.yaml cut in half", cut(lines=60), ["config", "-m", "runs/good"],
     r"is not a whole config of experiment 'digits'"),
    ("a cut params.yaml with --allow-config-change", cut(lines=60),
     ["train", "-m", "runs/good", "--allow-config-change"], r"is not a whole config"),
    ("a params.yaml cut to its first section", cut(lines=3), ["eval", "-m", "runs/good"],
     r"it lacks task, trainer, runtime \(was it cut short\?\)"),
    ("a params.yaml cut mid-line", cut(inside="    learning_rate:"), ["eval", "-m", "runs/good"],
     r"'runs/good/params.yaml' is not valid YAML: .*\. Restore it from a copy"),
    ("a params.yaml without a section", without("  ema:"), ["train", "-m", "runs/good"],
     r"is not a whole config of experiment 'digits': it lacks trainer\.ema \(was it cut"),
    ("config of a folder without a run", nothing, ["config", "-m", "elsewhere"],
     r"'elsewhere' holds no params.yaml: pass the directory of a run"),
    # -- an experiment of one's own module: -e MODULE:NAME, -e path/to/file.py:NAME
    ("a module that is not there", nothing, ["train", "-e", "mymodels:my_experiment"],
     r"Experiment mymodels:my_experiment: cannot import mymodels \(ModuleNotFoundError: No "
     r"module named 'mymodels'\): run the command from the folder that holds mymodels\.py \(the "
     r"current folder is importable\), or name its file: -e path/to/mymodels\.py:my_experiment"),
    ("config of a module that is not there", nothing, ["config", "-e", "mymodels:x"],
     r"cannot import mymodels \(ModuleNotFoundError"),
    ("a module whose import fails", write("broken.py", "raise RuntimeError('no GPU here')\n"),
     ["train", "-e", "broken:x"],
     r"cannot import broken \(RuntimeError: no GPU here, at .*broken\.py:1\): fix the module"),
    ("a module of bad syntax", write("broken.py", "def f(:\n"), ["train", "-e", "broken:x"],
     r"cannot import broken \(SyntaxError: .*broken\.py, line 1\)"),
    ("a module without its library", write("broken.py", "import not_installed_lib\n"),
     ["train", "-e", "broken:x"],
     r"No module named 'not_installed_lib', at .*: install not_installed_lib, or change"),
    ("a file that is not there", nothing, ["train", "-e", "models/mine.py:x"],
     r"cannot import models/mine\.py \(no such file in .*\): pass the path of a \.py file"),
    ("a file of another kind", nothing, ["train", "-e", "elsewhere/notes.txt:x"],
     r"elsewhere/notes\.txt is not a \.py file"),
    ("a module named with a dash", nothing, ["train", "-e", "my-models:x"],
     r"'my-models' is neither a module name .* nor a path to a \.py file"),
    ("an empty NAME", nothing, ["train", "-e", "mymodels:"], r"NAME is empty"),
    ("a NAME the module lacks", user_module, ["train", "-e", "mymodels:my_experimnt"],
     r"mymodels has no experiment or function 'my_experimnt'\. Did you mean "
     r"mymodels:my_experiment\? It registers: my_experiment; its functions of no arguments: "
     r"not_a_config, wide\. NAME must be"),
    ("eval of a NAME the module lacks", user_module,
     ["eval", "-e", "mymodels:nope", "-m", "runs/good"], r"no experiment or function 'nope'"),
    ("a NAME that is a class", user_module, ["train", "-e", "mymodels:Blobs"],
     r"mymodels:Blobs is the class Blobs \(a cadence\.Task\), not an experiment: NAME must "
     r"be an experiment the module registers"),
    ("a NAME of arguments", user_module, ["train", "-e", "mymodels:with_hidden"],
     r"is a function of arguments \(hidden\), not an experiment"),
    ("a NAME that returns a dict", user_module, ["train", "-e", "mymodels:not_a_config"],
     r"not_a_config\(\) returned a dict; an experiment function must return a "
     r"cadence\.ExperimentConfig"),
    ("a NAME that is a config", user_module, ["train", "-e", "mymodels:A_CONFIG"],
     r"is an ExperimentConfig \(wrap it: def A_CONFIG\(\): return \.\.\.\)"),
    ("a run recording a module of no folder of the user's", records("os"),
     ["eval", "-m", "runs/good"],
     r"'runs/good/params.yaml' records the experiment os:digits, but os is not a module of "
     r"the current folder"),
    ("a run recording its own code", records("runs/good/payload.py", "payload.py"),
     ["eval", "-m", "runs/good"],
     r"whose file runs/good/payload\.py is inside that run directory: cadence never runs code "
     r"that came with a run"),
    ("training a run recording its own code", records("runs.good.payload", "payload.py"),
     ["train", "-m", "runs/good"], r"payload\.py is inside that run directory"),
    # -- what a user's hooks return, when the Trainer is built
    ("a build_model that returns no model", hook_mistakes, ["train", "-e", "hooks:no_model"],
     r"^cadence: error: NoModel\.build_model\(\) returned str 'a model': it must return a "
     r"torch\.nn\.Module \(the model to train\)\.$"),
    ("a build_inputs that returns None", hook_mistakes, ["train", "-e", "hooks:no_inputs"],
     r"NoInputs\.build_inputs\(task\.train_data\) returned None: it must return the data of "
     r"task\.train_data: a DataLoader or another iterable of batches"),
    ("a build_inputs whose validation data yields no batch", hook_mistakes,
     ["train", "-e", "hooks:no_validation_batch"],
     r"NoValidationBatch\.build_inputs\(task\.validation_data\) returned a generator that "
     r"yields no batch: it must return data of at least one batch\..* run mode 'train'"),
    ("a metric that is a number", hook_mistakes, ["train", "-e", "hooks:metric_is_a_number"],
     r"MetricIsANumber\.build_metrics\(training=False\) returned 'accuracy': float 0\.5: it "
     r"must return metrics, each with update_state\(labels, outputs\), result\(\), reset\(\) "
     r"and all_reduce\(\) .* or a torchmetrics Metric\.$"),
    ("metrics that are a number", hook_mistakes, ["train", "-e", "hooks:metrics_are_a_number"],
     r"MetricsAreANumber\.build_metrics\(training=False\) returned float 0\.5: it must return "
     r"a mapping of metrics by name"),
    ("a validation set of no example", nothing,
     ["train", *FAST, "--set", "task.validation_fraction=0.0001"],
     r"DigitsTask\.build_inputs\(task\.validation_data\) returned a DataLoader over a dataset "
     r"of 0 examples: it must return data of at least one batch"),
    ("a training set of no example", nothing,
     ["train", *FAST, "--set", "task.validation_fraction=0.9999"],
     r"^cadence: error: task\.train_data: the dataset built for it holds no example, so not "
     r"one batch can be made at any batch size\. Check what builds it[^0-9]*$"),
    # -- messages that name only what is wrong
    ("a bad dropout beside good hidden sizes", nothing,
     ["train", *FAST, "--set", "task.model.dropout=1.5"],
     r"^cadence: error: task\.model\.dropout \(got 1\.5\) must be in \[0, 1\)\.$"),
    ("a bad hidden size and a bad dropout", nothing,
     ["train", *FAST, "--set", "task.model.hidden_sizes=[16,0]", "--set", "task.model.dropout=2"],
     r"^cadence: error: task\.model\.hidden_sizes \(got \[16, 0\]\) must be >= 1 each; "
     r"task\.model\.dropout \(got 2\.0\) must be in \[0, 1\)\.$"),
    # -- a run's best-export ledger (best/info.json) whose values are not numbers
    ("a ledger value that is a word", ledger_entry(value="high"), ["train", "-m", "runs/good"],
     r"^cadence: error: 'runs/good/best/info\.json' lists export 'best-\d+' with value str "
     r"'high', which is not a number, so the exports cannot be ranked\. Move the file aside "
     r"\(the exports beside it stay\) and run again: the ledger starts anew"),
    ("eval of a ledger whose step is a word", ledger_entry(step="twenty"),
     ["eval", "-m", "runs/good"], r"lists export 'best-\d+' with step str 'twenty', which is not "
     r"a step number"),
    ("eval of the best weights of a ledger of no value", ledger_entry(value=None),
     ["eval", "-m", "runs/good", "--checkpoint", "best"], r"with value None, which is not a "
     r"number.*Move the file aside"),
    ("a ledger whose logs hold a word", ledger_entry(logs={"accuracy": "good"}),
     ["train", "-m", "runs/good"], r"with logs\['accuracy'\] str 'good', which is not a number"),
    # -- the command line itself
    ("a key with an empty part", nothing, ["train", "--set", "trainer..train_steps=5"],
     r"the key 'trainer..train_steps' has an empty part"),
    ("a key with a trailing dot", nothing, ["train", "--set", "trainer.=5"],
     r"the key 'trainer.' has an empty part"),
    ("an override without =", nothing, ["train", "--set", "trainer.train_steps"],
     r"an override is KEY=VALUE"),
    ("an unknown key", nothing, ["train", "--set", "trainer.train_step=5"],
     r"unknown key 'trainer.train_step'. Did you mean 'trainer.train_steps'\?"),
    ("an unknown section", nothing, ["train", "--set", "trainr.train_steps=5"],
     r"unknown key 'trainr'"),
    ("a list where a number goes", nothing, ["train", "--set", "trainer.train_steps=[5]"],
     r"train_steps"),
    ("an unknown experiment", nothing, ["train", "-e", "digit"], r"Unknown experiment 'digit'"),
    ("an unknown mode", nothing, ["train", "--mode", "fit"], r"invalid choice: 'fit'"),
    ("an unknown command", nothing, ["fit"], r"invalid choice: 'fit'"),
    ("an unknown option", nothing, ["train", "--steps", "5"],
     r"unrecognized arguments: --steps 5"),
    ("a config file that does not exist", nothing, ["train", "-c", "missing.yaml"],
     r"Config file 'missing.yaml' does not exist"),
    ("a config file that is a list", write("list.yaml", "- 1\n- 2\n"), ["train", "-c", "list.yaml"],
     r"'list.yaml' must hold a mapping of config keys"),
    ("a config file of another experiment", nothing, ["train", "-e", "char_lm", "-c",
                                                      "runs/good/params.yaml"],
     r"is for experiment 'digits', not 'char_lm'"),
    ("no steps", nothing, ["train", *FAST, "--set", "trainer.train_steps=0"],
     r"trainer.train_steps is 0: set it"),
    ("negative steps", nothing, ["train", *FAST, "--set", "trainer.train_steps=-5"],
     r"trainer.train_steps: must be an integer >= 0 \(got -5\)"),
    ("zero steps per loop", nothing, ["train", *FAST, "--set", "trainer.steps_per_loop=0"],
     r"trainer.steps_per_loop: must be a positive integer \(got 0\)"),
    ("plot into a file", nothing, ["plot", "runs/good", "--out", "a_file.txt"],
     r"--out 'a_file.txt' is a file: pass a directory for the PNGs"),
    ("plot a smoothing of 1", nothing, ["plot", "runs/good", "--smooth", "1"],
     r"--smooth: 1 is not in \[0, 1\)"),
    ("plot a folder without scalars", nothing, ["plot", "elsewhere"],
     r"'elsewhere' holds no scalars"),
    ("plot a metric no run has", nothing, ["plot", "runs/good", "--metrics", "bleu"],
     r"bleu"),
]


@pytest.mark.parametrize(("mistake", "setup", "argv", "says"), COMMAND_LINE,
                         ids=[case[0] for case in COMMAND_LINE])
def test_a_mistake_at_the_command_line_is_one_clear_line_and_nothing_is_written(
        capsys, workdir, mistake, setup, argv, says):
    setup(workdir)
    before = snapshot(workdir)
    line = one_clear_line(capsys, argv)
    assert re.search(says, line), line
    assert snapshot(workdir) == before


@pytest.mark.parametrize(("experiment", "says"), [
    ("loss_per_example", r"cadence: error: LossPerExample\.build_losses\(\) returned a Tensor of "
                         r"shape \(\d+,\): it must return a scalar tensor \(one value\) as the "
                         r"loss\. Reduce the per-example losses, e\.g\. with \.mean\(\)\.$"),
    ("trains_nothing", r"cadence: error: TrainsNothing\.train_step\(\) returned a loss 'loss' "
                       r"that has no gradient \(requires_grad=False\) and updated no weight, so "
                       r"training would change nothing\. .*update them in train_step"),
])
def test_a_hook_refused_at_the_first_step_is_one_line_and_exit_2(capsys, workdir, experiment,
                                                                  says):
    """A step hook is checked at its first call: after the run started (its directory holds
    the config it was started with), before any step is counted or saved."""
    hook_mistakes(workdir)
    line = one_clear_line(capsys, ["train", "-e", f"hooks:{experiment}", "-m", "run"])
    assert re.match(says, line), line
    assert not list((workdir / "run").glob("checkpoints/ckpt-*"))


# ---------------------------------------------------------------------------- Python


def config_with(**changes):
    """The digits experiment's config with ``{"trainer.ema.decay": 1.0}``-like changes set as a
    Python user sets them: by assignment, after `load_config`."""
    config = load_config("digits", overrides=["task.model.hidden_sizes=[16]"])
    for key, value in changes.items():
        *parents, name = key.split("__")
        target = config
        for parent in parents:
            target = getattr(target, parent)
        setattr(target, name, value)
    return config


def run_in(directory):
    return lambda config: run_experiment(config, "train", directory)


def linear():
    return nn.Linear(2, 1)


def tiny_batches():
    x, y = make_classification(32)
    return [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]


class Hooks(cadence.Task):
    """A linear classifier whose hooks a case replaces (`task_trainer`)."""

    def build_model(self):
        return nn.Linear(4, 3)

    def build_inputs(self, params, input_context=None):
        return tiny_batches()

    def build_losses(self, labels, model_outputs, aux_losses=None):
        return nn.functional.cross_entropy(model_outputs, labels)

    def build_metrics(self, training=True):
        return {"accuracy": cadence.Accuracy()}


def task_trainer(validation_dataset=None, **hooks):
    """A `Trainer` (in memory: it writes nothing) of a task whose `hooks` replace `Hooks`'."""
    task = type("MyTask", (Hooks,), hooks)(cadence.TaskConfig())
    model = task.build_model()
    config = load_config(cadence.ExperimentConfig(), overrides=["trainer.train_steps=4"])
    return cadence.Trainer(config, task, model, torch.optim.SGD(model.parameters(), lr=0.1),
                           validation_dataset=validation_dataset)


class HalfAMetric:
    """Updates and reads, but cannot be reset or reduced across ranks."""

    def update_state(self, labels, outputs):
        pass

    def result(self):
        return 0.0

    def reset(self):
        pass


def loop_ends(**returns):
    """A `StandardTrainer` and `StandardEvaluator` whose `train_loop_end` / `eval_end` return
    what `returns` says."""
    class LoopEnds(TinyClassifier):
        def train_loop_end(self):
            return returns.get("train_loop_end", super().train_loop_end())

        def eval_end(self):
            return returns.get("eval_end", super().eval_end())

    return LoopEnds(make_loader(), make_loader(shuffle=False))


def collect(**metrics):
    """``collect_metrics(**metrics)`` in the first epoch of a `TrainLoop` that writes nothing."""
    with TrainLoop([], max_epoch=1, print_func=lambda line: None) as loop:
        for _ in loop.iter_epochs():
            loop.collect_metrics(**metrics)


PYTHON = [
    # (what the user did, the call, the exception, what its one line says)
    ("steps per loop 2.5", lambda: config_with(trainer__steps_per_loop=2.5).validate(),
     ConfigError, r"trainer.steps_per_loop: must be a positive integer \(got 2.5\)"),
    ("a seed as a string", lambda: config_with(runtime__seed="3").validate(), ConfigError,
     r"runtime.seed: must be an integer in \[0, 2\*\*32\) or null \(got '3'\)"),
    ("betas as a 1-tuple", lambda: config_with(
        trainer__optimizer_config__optimizer__betas=(0.9,)).validate(), ConfigError,
     r"betas: must be a pair of numbers in \[0, 1\)"),
    ("a boolean step count", lambda: config_with(trainer__train_steps=True).validate(),
     ConfigError, r"trainer.train_steps: must be an integer >= 0 \(got True\)"),
    ("an EMA decay of 1", lambda: config_with(trainer__ema__decay=1).validate(), ConfigError,
     r"trainer.ema.decay: must be in \[0, 1\)"),
    ("a NaN weight decay", lambda: config_with(
        trainer__optimizer_config__optimizer__weight_decay=float("nan")).validate(),
     ConfigError, r"weight_decay: must be a finite number >= 0 \(got nan\)"),
    ("a gamma of 0", lambda: config_with(
        trainer__optimizer_config__learning_rate__gamma=0.0).validate(), ConfigError,
     r"learning_rate.gamma: must be a positive finite number"),
    ("best exports at ../best", lambda: config_with(
        trainer__best_checkpoint_export_subdir="../best").validate(), ConfigError,
     r"best_checkpoint_export_subdir: must be a relative path inside the run"),
    ("a fraction of the images of 1", lambda: config_with(task__validation_fraction=1.0)
     .validate(), ConfigError, r"task.validation_fraction: must be a fraction in \(0, 1\)"),
    ("several at once", lambda: config_with(runtime__seed=-1, trainer__max_to_keep=0).validate(),
     ConfigError, r"^Invalid config: trainer.max_to_keep: .* runtime.seed: .*$"),
    ("run_experiment of a dict", lambda: run_experiment({"trainer": {}}, "train", "run"),
     TypeError, r"`config` \(got dict\) must be an ExperimentConfig"),
    ("run_experiment of an unknown mode", lambda: run_experiment(config_with(), "fit", "run"),
     ValueError, r"Unknown mode 'fit'; valid: train, train_and_eval"),
    ("run_experiment of a bad value", lambda: run_in("run")(config_with(runtime__seed=-1)),
     ConfigError, r"runtime.seed: must be an integer in \[0, 2\*\*32\)"),
    ("run_experiment inside a run", lambda: run_in("runs/good/checkpoints")(config_with()),
     ConfigError, r"is inside the run directory 'runs/good'"),
    ("run_experiment among someone else's files", lambda: run_in("elsewhere")(config_with()),
     ConfigError, r"'elsewhere' holds files that are not a run's"),
    ("run_experiment into a file", lambda: run_in("a_file.txt")(config_with()), ConfigError,
     r"'a_file.txt' is a file"),
    ("run_experiment of a changed config", lambda: run_in("runs/good")(config_with(
        trainer__train_steps=20, trainer__steps_per_loop=10, trainer__validation_interval=10,
        trainer__checkpoint_interval=10, task__model__dropout=0.3)), ConfigError,
     r"holds a run with a different config \(task.model.dropout: 0.1 -> 0.3\)"),
    ("a locked config changed", lambda: (lambda c: (c.lock(), setattr(c.trainer, "train_steps",
                                                                      3)))(config_with()),
     ConfigError, r"Cannot set trainer.train_steps \(got 3\): the config is locked"),
    ("load_config of an unknown experiment", lambda: load_config("digit"), ConfigError,
     r"Unknown experiment 'digit'\. Registered: .*digits"),
    ("load_config of a module that is not there", lambda: load_config("mymodels:x"),
     ConfigError, r"cannot import mymodels \(ModuleNotFoundError: No module named 'mymodels'"),
    ("load_config of an empty module", lambda: load_config(":x"), ConfigError,
     r"Experiment ':x': the module is empty"),
    ("run_experiment of a module that is not there", lambda: run_experiment(
        "mymodels:x", "train", "run"), ConfigError, r"cannot import mymodels"),
    ("run_experiment of an unknown name", lambda: run_experiment("digit", "train", "run"),
     ConfigError, r"Unknown experiment 'digit'"),
    ("load_config of an override that is no string", lambda: load_config(
        "digits", overrides=[5]), ConfigError, r"overrides: 5 is not a 'key=value' string"),
    ("load_config of a mapping with a word for a number", lambda: load_config(
        "digits", overrides={"trainer": {"train_steps": "many"}}), ConfigError,
     r"'trainer.train_steps': Value 'many'.*could not be converted to Integer"),
    ("load_config of a missing file", lambda: load_config(config_files=["missing.yaml"]),
     ConfigError, r"Config file 'missing.yaml' does not exist"),
    ("register_experiment of no function", lambda: cadence.register_experiment("x")(5),
     TypeError, r"@register_experiment\('x'\) decorates a function"),
    ("a CheckpointManager into ''", lambda: CheckpointManager({"m": linear()}, ""),
     ConfigError, r"The checkpoint directory is '': pass a directory"),
    ("a CheckpointManager into a file", lambda: CheckpointManager({"m": linear()},
                                                                  "a_file.txt"),
     ConfigError, r"The checkpoint directory 'a_file.txt' is a file"),
    ("a CheckpointManager keeping 0", lambda: CheckpointManager({"m": linear()}, "c",
                                                                max_to_keep=0),
     ValueError, r"`max_to_keep` \(got 0\) must be a positive int, or None"),
    ("a CheckpointManager every 2.5 steps", lambda: CheckpointManager(
        {"m": linear()}, "c", checkpoint_interval=2.5), TypeError,
     r"`checkpoint_interval` \(got 2.5\) must be a positive int or None"),
    ("a CheckpointManager of a number", lambda: CheckpointManager(5, "c"), TypeError,
     r"`state` \(got int\) must be a cadence.Module or a dict of stateful objects"),
    ("an exporter comparing 'bigger'", lambda: BestCheckpointExporter("b", "accuracy", "bigger"),
     ValueError, r"`metric_comp` \(got 'bigger'\) must be 'higher' or 'lower'"),
    ("an exporter of no metric", lambda: BestCheckpointExporter("b", "", "higher"),
     ValueError, r"`metric_name` must name an evaluation metric"),
    ("an exporter keeping 0", lambda: BestCheckpointExporter("b", "accuracy", "higher",
                                                             max_to_keep=0),
     ValueError, r"`max_to_keep` \(got 0\) must be a positive int"),
    ("a Controller of nothing", lambda: Controller(), ValueError,
     r"Controller needs a `trainer`, an `evaluator`, or both"),
    ("a Controller of an object", lambda: Controller(trainer=object(), steps_per_loop=1),
     TypeError, r"`trainer` \(got object\) must have a train\(num_steps\) method"),
    ("a compile mode that does not exist", lambda: StandardTrainerOptions(
        compile_mode="fastest"), ValueError, r"`compile_mode` \(got 'fastest'\) must be one of"),
    ("load_weights of nothing", lambda: load_weights(linear(), "nowhere"),
     cadence.CheckpointError, r"'nowhere' does not exist"),
    ("load_weights of someone else's files", lambda: load_weights(linear(), "elsewhere"),
     cadence.CheckpointError, r"'elsewhere' holds no weights"),
    ("a TrainLoop of 0 steps", lambda: TrainLoop([], max_step=0), ValueError,
     r"`max_step` \(got 0\) must be a positive int or None"),
    ("a TrainLoop of 'a' epochs", lambda: TrainLoop([], max_epoch="a"), ValueError,
     r"`max_epoch` \(got 'a'\) must be a positive int or None"),
    ("a TrainLoop of 2.5 epochs", lambda: TrainLoop([], max_epoch=2.5), ValueError,
     r"`max_epoch` \(got 2.5\)"),
    # -- what a user's hooks return: checked at their first call (the Trainer's steps) or when
    # the Trainer is built, in one line naming the hook, what it returned and what it must
    ("a build_losses of a loss per example", lambda: task_trainer(
        build_losses=lambda self, labels, outputs, aux_losses=None:
        nn.functional.cross_entropy(outputs, labels, reduction="none")).train(1),
     HookValueError, r"^MyTask\.build_losses\(\) returned a Tensor of shape \(8,\): it must "
     r"return a scalar tensor \(one value\) as the loss\. Reduce the per-example losses, e\.g\. "
     r"with \.mean\(\)\.$"),
    ("a build_losses that detaches the loss", lambda: task_trainer(
        build_losses=lambda self, labels, outputs, aux_losses=None:
        nn.functional.cross_entropy(outputs, labels).detach()).train(1),
     HookValueError, r"^MyTask\.build_losses\(\) returned a Tensor of shape \(\) without a "
     r"gradient \(requires_grad=False\): it must return a scalar tensor with a gradient"),
    ("a build_losses of a float", lambda: task_trainer(
        build_losses=lambda self, labels, outputs, aux_losses=None: 0.5).train(1),
     HookTypeError, r"^MyTask\.build_losses\(\) returned float 0\.5: it must return a scalar "
     r"tensor with a gradient, computed from the model's outputs\.$"),
    ("a validation loss per example", lambda: task_trainer(
        build_losses=lambda self, labels, outputs, aux_losses=None:
        nn.functional.cross_entropy(outputs, labels, reduction="none")).evaluate(1),
     HookValueError, r"^MyTask\.build_losses\(\) returned a Tensor of shape \(8,\): it must "
     r"return a scalar tensor"),
    ("a train_step of a list", lambda: task_trainer(
        train_step=lambda self, inputs, model, optimizer, metrics=None: [1.0]).train(1),
     HookTypeError, r"^MyTask\.train_step\(\) returned list \[1\.0\]: it must return a dict "
     r"with the loss under 'loss' \(Task\.loss\)\.$"),
    ("a train_step whose loss is a word", lambda: task_trainer(
        train_step=lambda self, inputs, model, optimizer, metrics=None: {"loss": "low"}
    ).train(1), HookTypeError, r"^MyTask\.train_step\(\) returned str 'low' under 'loss': it "
     r"must return a scalar tensor as the loss\.$"),
    ("a validation_step of a tensor", lambda: task_trainer(
        validation_step=lambda self, inputs, model, metrics=None: model(inputs[0])).evaluate(1),
     HookTypeError, r"^MyTask\.validation_step\(\) returned a Tensor of shape \(8, 3\): it "
     r"must return a dict of logs \(with the loss under 'loss' for validation_loss\), or "
     r"None\.$"),
    ("a process_metrics that returns its values", lambda: task_trainer(
        process_metrics=lambda self, metrics, labels, outputs, **kwargs: {"mean": 1.0}
    ).train(1), HookTypeError, r"^MyTask\.process_metrics\(\) returned dict \{'mean': 1\.0\}: "
     r"it must return None: it updates the metrics it is given, in place"),
    ("a build_metrics of a list", lambda: task_trainer(
        build_metrics=lambda self, training=True: [cadence.Accuracy()]), HookTypeError,
     r"^MyTask\.build_metrics\(training=True\) returned list \[.*\]: it must return a mapping "
     r"of metrics by name"),
    ("a metric without all_reduce", lambda: task_trainer(
        build_metrics=lambda self, training=True: {"hits": HalfAMetric()}), HookTypeError,
     r"returned 'hits': a HalfAMetric, which has no all_reduce\(\): it must return metrics"),
    ("a build_inputs of a number", lambda: task_trainer(
        build_inputs=lambda self, params, input_context=None: 7), HookTypeError,
     r"^MyTask\.build_inputs\(task\.train_data\) returned int 7: it must return the data"),
    ("a build_inputs of no validation batch", lambda: task_trainer(
        build_inputs=lambda self, params, input_context=None: (
            tiny_batches() if params.is_training else [])), HookValueError,
     r"^MyTask\.build_inputs\(task\.validation_data\) returned list \[\], which holds no "
     r"batch: it must return data of at least one batch"),
    ("an empty validation DataLoader given to the Trainer", lambda: task_trainer(
        validation_dataset=DataLoader(TensorDataset(torch.zeros(0, 4)), batch_size=8)),
     ValueError, r"^Trainer: `validation_dataset` \(a DataLoader over a dataset of 0 examples\) "
     r"must hold at least one batch"),
    ("a train_loop_end of a list", lambda: loop_ends(train_loop_end=[0.5]).train(1),
     HookTypeError, r"^LoopEnds\.train_loop_end\(\) returned list \[0\.5\]: it must return "
     r"None, a mapping of logs \(metric names to values\), a tensor, an array or a number"),
    ("an eval_end of a word", lambda: loop_ends(eval_end="done").evaluate(1), HookTypeError,
     r"^LoopEnds\.eval_end\(\) returned str 'done': it must return None, a mapping of logs"),
    ("a metric collected as a word", lambda: collect(loss="low"), TypeError,
     r"^TrainLoop\.collect_metrics\(\): 'loss' \(got str 'low'\) must be a number, an array "
     r"of numbers, a tensor or a torchmetrics Metric\.$"),
    ("a metric collected as a dict", lambda: collect(loss={"a": 1.0}), TypeError,
     r"'loss' \(got dict \{'a': 1\.0\}\) must be a number"),
    ("a metric collected as None", lambda: collect(accuracy=None), TypeError,
     r"'accuracy' \(got None\) must be a number"),
    ("a metric collected as a list of words", lambda: collect(loss=[1.0, "x"]), TypeError,
     r"'loss' \(got list \[1\.0, 'x'\]\) must be a number"),
    ("a DataLoader of no example, remainder dropped", lambda: cadence.build_dataloader(
        TensorDataset(torch.zeros(0, 2)), DataConfig(global_batch_size=4, is_training=True)),
     ConfigError, r"^task\.train_data: the dataset built for it holds no example, so not one "
     r"batch can be made at any batch size\.[^0-9]*$"),
    # The engine's integer checks name the class, the argument and the fix (one helper).
    ("a LossGuard of -2 trials", lambda: cadence.LossGuard(max_trials=-2), ValueError,
     r"^LossGuard: `max_trials` \(got -2\) must be an int >= -1\. Pass -1 to ignore blow-ups"),
    ("an EarlyStopping of no patience", lambda: EarlyStopping("loss", patience=0), ValueError,
     r"^EarlyStopping: `patience` \(got 0\) must be a positive int\. Pass e\.g\. patience=3"),
    ("a ProgressBar of True logs", lambda: cadence.ProgressBar(max_logs=True), ValueError,
     r"^ProgressBar: `max_logs` \(got True\) must be a non-negative int\."),
    ("epochs of 2.5 steps", lambda: StandardTrainerOptions(steps_per_epoch=2.5), ValueError,
     r"^StandardTrainerOptions: `steps_per_epoch` \(got 2.5\) must be a non-negative int or "
     r"None\. Pass None to make an epoch a pass over the data"),
    ("a stop agreed every 0 steps", lambda: StopAgreement(every=0), ValueError,
     r"^StopAgreement: `every` \(got 0\) must be a positive int"),
    # The engine names its own arguments, not a Task config's keys (the Task layer does that).
    ("a device that is none", lambda: local_device("gpu0"), ValueError,
     r"^local_device: `name` \(got 'gpu0'\) is not a device: .* Use 'auto', 'cpu'"),
    # An argument of the wrong kind at an entry point: the argument, what it must be, an example
    # (issue 40: run_experiment(config, "train", 123) named no argument).
    ("run_experiment into a number", lambda: run_experiment(config_with(), "train", 123),
     TypeError, r"^run_experiment: `model_dir` \(got int 123\) must be a path \(a str or an "
     r"os\.PathLike\), the run's directory, e\.g\. run_experiment\(config, mode, 'runs/mine'\)\.$"),
    ("run_experiment of one callback, not a list", lambda: run_experiment(
        config_with(), "train", "r", callbacks=cadence.ProgressBar()), TypeError,
     r"^run_experiment: `callbacks` \(got a ProgressBar\) must be a list of cadence\.Callback "
     r"objects, e\.g\. callbacks=\[cadence\.ProgressBar\(\)\]\.$"),
    ("run_experiment with a progress bar 'yes'", lambda: run_experiment(
        config_with(), "train", "r", progress_bar="yes"), TypeError,
     r"^run_experiment: `progress_bar` \(got str 'yes'\) must be True or False or None"),
    ("load_config of one file, not a list", lambda: load_config("digits", config_files=5),
     TypeError, r"^load_config: `config_files` \(got int 5\) must be a list of paths of YAML "
     r"files, e\.g\. config_files=\['my_config\.yaml'\]\.$"),
    ("load_config of one override, not a list", lambda: load_config(
        "digits", overrides="trainer.train_steps=5"), TypeError,
     r"^load_config: `overrides` \(got str 'trainer\.train_steps=5'\) must be a list of "
     r"'KEY=VALUE' strings or a mapping, e\.g\. overrides=\['trainer\.train_steps=500'\]\.$"),
    ("a Controller writing summaries to a number", lambda: cadence.Controller(
        trainer=CountingTrainer(), steps_per_loop=1, summary_dir=5), TypeError,
     r"^Controller: `summary_dir` \(got int 5\) must be a path \(a str or an os\.PathLike\) or "
     r"None, e\.g\. summary_dir='runs/mine/train'\.$"),
    ("a Controller given a number as its checkpoint manager", lambda: cadence.Controller(
        trainer=CountingTrainer(), steps_per_loop=1, checkpoint_manager=5), TypeError,
     r"^Controller: `checkpoint_manager` \(got int 5\) must be a cadence\.CheckpointManager "
     r"\(or have its methods save, restore_or_initialize\) or None\.$"),
    ("a Controller with an action that is no function", lambda: cadence.Controller(
        trainer=CountingTrainer(), steps_per_loop=1, train_actions=["print"]), TypeError,
     r"^Controller: `train_actions\[0\]` \(got str 'print'\) is not what `train_actions` "
     r"must hold: a list of functions of the logs"),
    ("a TrainLoop checkpointing into a number", lambda: cadence.TrainLoop(
        linear(), checkpoint_dir=5), TypeError,
     r"^TrainLoop: `checkpoint_dir` \(got int 5\) must be a path \(a str or an os\.PathLike\) "
     r"or None, e\.g\. checkpoint_dir='runs/loop'\.$"),
    ("a TrainLoop printing with a number", lambda: cadence.TrainLoop(linear(), print_func=5),
     TypeError, r"^TrainLoop: `print_func` \(got int 5\) must be a function, e\.g\. "
     r"print_func=logging\.info\.$"),
    ("launch_train_with_config of a dict", lambda: cadence.launch_train_with_config(
        {"model": None}, cadence.SimpleTrainer()), TypeError,
     r"^launch_train_with_config: `config` \(got dict \{'model': None\}\) must be a "
     r"cadence\.tensorpack\.TrainConfig"),
    ("a TrainConfig logging into a number", lambda: cadence.TrainConfig(data=[1], logdir=5),
     TypeError, r"^TrainConfig: `logdir` \(got int 5\) must be a path"),
    ("a tensorpack trainer logging into a number", lambda: cadence.SimpleTrainer(logdir=5),
     TypeError, r"^SimpleTrainer: `logdir` \(got int 5\) must be a path"),
    ("a tensorpack train of one callback, not a list", lambda: cadence.SimpleTrainer().train(
        callbacks=cadence.ProgressBar(), steps_per_epoch=1, max_epoch=1), TypeError,
     r"^SimpleTrainer: `callbacks` \(got a ProgressBar\) must be a list of "
     r"cadence\.Callback objects"),
]


@pytest.mark.parametrize(("mistake", "call", "error", "says"), PYTHON,
                         ids=[case[0] for case in PYTHON])
def test_a_mistake_in_python_is_one_exception_of_one_line_and_nothing_is_written(
        workdir, mistake, call, error, says):
    before = snapshot(workdir)
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message and re.search(says, message), message
    assert snapshot(workdir) == before


# (what the user did, setup of the working directory, the call, the exception, its line)
PYTHON_ON_FILES = [
    ("load_config of a NAME the module lacks", user_module, lambda: load_config("mymodels:nope"),
     cadence.NotRegisteredError, r"mymodels has no experiment or function 'nope'"),
    ("load_config of a NAME that returns a dict", user_module,
     lambda: load_config("mymodels.py:not_a_config"), ConfigError, r"returned a dict"),
    ("run_experiment into a run whose params.yaml is cut", cut(lines=60),
     lambda: run_in("runs/good")(config_with(
         trainer__train_steps=20, trainer__steps_per_loop=10, trainer__validation_interval=10,
         trainer__checkpoint_interval=10)), ConfigError,
     r"'runs/good' holds a run with a different config \(the saved config is not whole: it "
     r"lacks .* \(was it cut short\?\)\): use another model directory for a new run, or pass "
     r"--allow-config-change"),
    ("an exporter over a ledger whose value is a word", ledger_entry(value="high"),
     lambda: BestCheckpointExporter("runs/good/best", "accuracy", "higher"),
     cadence.CheckpointError, r"^'runs/good/best/info\.json' lists export 'best-\d+' with value "
     r"str 'high', which is not a number, so the exports cannot be ranked\. Move the file aside "
     r"\(the exports beside it stay\)"),
    ("an exporter over a ledger whose value is NaN", ledger_entry(value=float("nan")),
     lambda: BestCheckpointExporter("runs/good/best", "accuracy", "higher"),
     cadence.CheckpointError, r"with value float nan, which is not a number"),
    ("load_run_config of a cut params.yaml", cut(lines=60),
     lambda: load_run_config("runs/good/params.yaml"), ConfigError,
     r"'runs/good/params.yaml' is not a whole config of experiment 'digits': it lacks"),
    ("load_config of a params.yaml recording its run's code", records(
        "runs/good/payload.py", "payload.py"),
     lambda: load_config(config_files=["runs/good/params.yaml"]),
     ConfigError, r"is inside that run directory: cadence never runs code that came with a run"),
]


@pytest.mark.parametrize(("mistake", "setup", "call", "error", "says"), PYTHON_ON_FILES,
                         ids=[case[0] for case in PYTHON_ON_FILES])
def test_a_mistake_in_python_about_files_is_one_exception_of_one_line_and_nothing_is_written(
        workdir, mistake, setup, call, error, says):
    setup(workdir)
    before = snapshot(workdir)
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message and re.search(says, message), message
    assert snapshot(workdir) == before


def test_the_sweep_holds_at_least_a_hundred_mistakes():
    assert len(COMMAND_LINE) + len(PYTHON) + len(PYTHON_ON_FILES) >= 100


# ------------------------------------------------------------- the environment's failures


@pytest.mark.parametrize("disk", ["fake", "tmpfs"])
def test_a_full_disk_at_the_start_is_one_line_exit_1_and_leaves_nothing(capsys, workdir,
                                                                        disk):
    """The lock is the first file a training run writes: a full disk there is one line, exit
    1, and no run directory is left behind; once there is space, the same command trains. A
    fake write of the lock that fails, and a real tmpfs filled up."""
    from cadence.core.run_dir import RunLock

    with contextlib.ExitStack() as stack:
        patch = stack.enter_context(pytest.MonkeyPatch.context())  # (not undoing the chdir)
        if disk == "fake":
            root = workdir

            def full(self):
                raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

            patch.setattr(RunLock, "_acquire", full)
            ballast = None
        else:
            root = stack.enter_context(small_tmpfs(workdir / "disk", "1m"))
            ballast = fill(root)
        run = (root / "run").relative_to(workdir)
        status = main(["train", *FAST, "-m", str(run)])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 1 and not any("Traceback" in line for line in err), err
        assert err[-1] == (f"cadence: error: Taking the run's lock {str(run / 'train.lock')!r} "
                           "failed: No space left on device. There is no good checkpoint yet: "
                           "free some space, then run the same command again.")
        assert not (workdir / run).exists()
        patch.undo()
        if ballast is not None:
            ballast.unlink()
        assert main(["train", *FAST, "-m", str(run)]) == 0  # with space, the same command
        assert (workdir / run / "checkpoints" / "ckpt-20").is_dir()


@pytest.mark.parametrize("disk", ["fake", "tmpfs"])
def test_a_failed_write_of_the_config_is_one_line_exit_1_and_the_run_is_kept(capsys, workdir,
                                                                            disk):
    """A config change is written as the continued run starts (params.yaml, its old one kept
    beside it): a denied write (faked: as root, no permission is denied) and a real full tmpfs
    are one line, exit 1, naming the newest good checkpoint; the run is kept as it was but for
    its timeline, which records the failed attempt."""
    import cadence.task.config_files as config_files

    with contextlib.ExitStack() as stack:
        if disk == "fake":
            run = Path("runs/good")

            def denied(config, path):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))

            stack.enter_context(pytest.MonkeyPatch.context()).setattr(
                config_files, "save_config", denied)
            says = "Permission denied. The newest good checkpoint is {ckpt} (step 20): fix the"
            says += " permissions, then run the same command again."
        else:
            disk_root = stack.enter_context(small_tmpfs(workdir / "disk", "4m"))
            shutil.copytree(workdir / "runs" / "good", disk_root / "good")
            run = Path("disk/good")
            says = "No space left on device. The newest good checkpoint is {ckpt} (step 20): free "
            says += "some space, then run the same command again."
        before = snapshot(workdir / run)
        timeline = workdir / run / "timeline" / "run.jsonl"
        recorded = timeline.read_text()
        if disk == "tmpfs":  # room for the lock (a page), not for the config and its copy
            fill(workdir / run, leave=8192)
        status = main(["train", "-m", str(run), "--set", "trainer.train_steps=30",
                       "--allow-config-change"])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 1 and err[-1] == (
            f"cadence: error: Saving the run's config to {str(run / 'params.yaml')!r} failed: "
            + says.format(ckpt=run / "checkpoints" / "ckpt-20")), err
        after = snapshot(workdir / run)
        changed = {k for k in set(after) | set(before) if after.get(k) != before.get(k)}
        assert {k for k in changed if not k.startswith("ballast")} == {"timeline/run.jsonl"}
        # The timeline kept every line and added the failed attempt, which ended in an error.
        added = timeline.read_text().removeprefix(recorded)
        assert added != timeline.read_text() and '"outcome":"error"' in added.splitlines()[-1]


def test_a_model_too_large_for_memory_is_one_line_exit_1(capsys, workdir):
    status = main(["train", *FAST, "-m", "run", "--set",
                   "task.model.hidden_sizes=[400000,400000]"])  # 640 GB of weights
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and not any("Traceback" in line for line in err), err
    assert re.match(r"cadence: error: Out of memory \(.*\)\. Make the model or the batch "
                    r"smaller", err[-1]), err[-1]
    assert not (workdir / "run").exists()


def test_a_bug_is_not_dressed_as_the_environment(monkeypatch):
    """Only the machine's failures become one line; a bug keeps its traceback."""
    from cadence.task.cli import environment_problem

    assert environment_problem(OSError(errno.ENOENT, "No such file")) is None
    assert environment_problem(RuntimeError("shape mismatch")) is None
    assert environment_problem(MemoryError()) is not None

