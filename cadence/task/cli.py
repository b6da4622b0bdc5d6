"""The ``cadence`` command (also ``python -m cadence``).

::

    cadence train                          train the default experiment (digits) in a new run
                                           directory under runs/, evaluating and exporting the
                                           best weights; run it again to resume an unfinished run
    cadence train --experiment char_lm --set trainer.train_steps=500
    cadence train --model-dir runs/mine --config-file my.yaml --mode train
    cadence eval  --model-dir runs/mine    evaluate the newest checkpoint of a run
    cadence experiments                    list the registered experiments
    cadence config --experiment char_lm    print the final config as YAML
    cadence train -e mymodels:my_experiment   an experiment of your own module (in the
                                           current folder; or -e path/to/mymodels.py:NAME);
                                           `cadence train -m RUN` finds the module again
    cadence --version                      print the installed version
    cadence inspect runs/mine              what its newest checkpoint holds
    cadence export runs/mine --out model/  its model as one model.safetensors (+ config.json
                                           for a transformers model); --checkpoint best|PATH
    cadence goodput runs/mine [--json]     its goodput and badput by cause, every attempt
    cadence plot runs/a runs/b             PNG curves of the runs' scalars, resumes and best
                                           exports marked (needs matplotlib: cadence[plot])
    cadence prepare-data docs/*.txt --out data/train --tokenizer tokenizer.json
                                           text files tokenized into token shards (a manifest,
                                           written last: a folder is whole or absent)

On a terminal a progress bar shows the step, ETA, steps/sec and the latest metrics; otherwise
(CI, a log file) one plain line per loop. Ctrl-C (or SIGTERM) saves a checkpoint and exits with
130 (143); the same command then resumes.

Only the standard library and `cadence.core` are imported until a command runs, so ``--help``
answers at once.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cadence.core.checkpoint_dir import CheckpointDirectory
from cadence.core.errors import (
    CheckpointError,
    ConfigError,
    HookError,
    JobFailure,
    MissingMetricError,
    Preempted,
)
from cadence.core.rank import process_rank
from cadence.core.run_dir import RunDirectory, RunLockedError
from cadence.core.slurm import adopt_launch_environment
from cadence.core.storage import FIXES, storage_cause

logger = logging.getLogger("cadence")

RUNS_DIR = Path("runs")


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    default = "the one recorded in the run directory that --model-dir names, else digits"
    parser.add_argument("--experiment", "-e", metavar="EXPERIMENT",
                        help="a registered experiment, or one of your own module: MODULE:NAME "
                        "(the current folder is importable) or path/to/file.py:NAME, NAME an "
                        "experiment the module registers or a function there that returns an "
                        f"ExperimentConfig (default: {default})")
    parser.add_argument("--config-file", "-c", action="append", default=[], metavar="FILE",
                        help="YAML merged over the experiment's defaults (repeatable, in order)")
    parser.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE",
                        dest="overrides",
                        help="override one value, e.g. --set trainer.train_steps=500 "
                        "(repeatable; applied last, in order)")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose error is one line like every other mistake's:
    ``cadence: error: cadence train: argument --model-dir/-m: is empty; ...`` (exit 2)."""

    def error(self, message: str) -> Any:
        self.exit(2, f"cadence: error: {self.prog}: {message} (see {self.prog} --help).\n")


class _Version(argparse.Action):
    """``--version``: prints ``cadence <version>`` and exits 0: `cadence.__version__`, the one
    source of the version (the package metadata is made from it), so that it names the code
    that runs even where another cadence is installed."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from cadence import __version__

        sys.stdout.write(f"cadence {__version__}\n")  # on stdout, as argparse's is
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``cadence`` command."""
    parser = _Parser(
        prog="cadence", description="Train and evaluate registered cadence experiments.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `cadence train` to train the default experiment.",
    )
    parser.add_argument("--version", action=_Version, help="print cadence's version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_train_command, _add_eval_command, _add_experiments_command,
                _add_config_command, _add_plot_command, _add_inspect_command,
                _add_export_command, _add_goodput_command, _add_prepare_data_command):
        add(commands)
    return parser


def _add_train_command(commands: Any) -> None:
    """The ``cadence train`` subcommand and its arguments."""
    from cadence.task.config_checks import MODES

    train = commands.add_parser(
        "train", help="train an experiment (resumes unfinished runs)",
        description="Trains an experiment in a run directory: checkpoints, evaluations and "
        "summaries at their intervals, the best weights exported. Running the same command again "
        "resumes the run; Ctrl-C or SIGTERM saves a checkpoint and exits.")
    _add_config_arguments(train)
    train.add_argument("--model-dir", "-m", type=_model_dir_argument,
                       help="the run directory (default: the newest unfinished run of the "
                       "experiment with the same config, else a new one under runs/)")
    train.add_argument("--mode", choices=MODES, default="train_and_eval",
                       help="what to run (default: train_and_eval)")
    train.add_argument("--allow-config-change", action="store_true",
                       help="continue a run whose saved config differs from this one")
    _add_progress_arguments(train)


def _add_eval_command(commands: Any) -> None:
    """The ``cadence eval`` subcommand and its arguments."""
    evaluate = commands.add_parser(
        "eval", help="evaluate a run's newest checkpoint, its best export, or chosen weights",
        description="Evaluates the weights of a run -- its newest checkpoint (default), its "
        "best export (--checkpoint best) or a path -- as training evaluated them (with an EMA, "
        "the weights the file holds), and records the evaluation beside training's, naming "
        "the weights; --mode continuous_eval evaluates every new checkpoint.")
    _add_config_arguments(evaluate)
    evaluate.add_argument("--model-dir", "-m", type=_model_dir_argument,
                          help="the run directory (default: the newest run of the experiment)")
    evaluate.add_argument("--mode", choices=("eval", "continuous_eval"), default="eval",
                          help="eval once (default), or every new checkpoint")
    evaluate.add_argument("--checkpoint", metavar="WHICH",
                          help="what to evaluate (with --mode eval): latest (default: the "
                          "newest checkpoint), best (the best export) or a path (a "
                          "ckpt-<step>, a best-export directory, a .safetensors file)")


def _add_experiments_command(commands: Any) -> None:
    """The ``cadence experiments`` subcommand and its arguments."""
    commands.add_parser("experiments", help="list the registered experiments",
                        description="Lists the registered experiments with one line each; "
                        "the default is marked. Your own: cadence train -e MODULE:NAME.")


def _add_config_command(commands: Any) -> None:
    """The ``cadence config`` subcommand and its arguments."""
    config = commands.add_parser(
        "config", help="print the final config as YAML",
        description="Prints the final config -- the experiment's defaults, then each "
        "--config-file, then each --set, or a run's params.yaml -- as the YAML a run saves.")
    _add_config_arguments(config)
    config.add_argument("--model-dir", "-m", type=_model_dir_argument,
                        help="a run directory: its params.yaml is the base")


def _add_plot_command(commands: Any) -> None:
    """The ``cadence plot`` subcommand and its arguments."""
    plot = commands.add_parser(
        "plot", help="draw runs' training and evaluation scalars as PNG curves",
        description="One PNG per scalar, one colour per run: training solid, evaluation dashed, "
        "dotted lines where a run resumed, a star at its best export. Needs matplotlib "
        "(pip install 'cadence[plot]').")
    plot.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                      help="run directories (or summary directories) to compare")
    plot.add_argument("--out", "-o", type=Path, metavar="DIR",
                      help="where the PNGs go (default: <first RUN_DIR>/plots)")
    plot.add_argument("--metrics", nargs="+", action="extend", metavar="NAME",
                      help="only these scalars: names or patterns, e.g. --metrics accuracy "
                      "'*loss' (default: all)")
    plot.add_argument("--smooth", type=_smoothing_weight, default=0.0, metavar="W",
                      help="TensorBoard's smoothing weight in [0, 1), e.g. 0.6 (default: 0, "
                      "the values as they are)")
    plot.add_argument("--log-y", action="store_true",
                      help="logarithmic y axes (for metrics whose values are all positive)")


def _add_inspect_command(commands: Any) -> None:
    """The ``cadence inspect`` subcommand and its arguments."""
    inspect = commands.add_parser(
        "inspect", help="print what a checkpoint holds: step, files, tensors, values, config",
        description="Lists a checkpoint's files, the tensors of its state files (safetensors) "
        "and shards (DCP) with their dtypes, shapes and sizes, its other values and the run's "
        "config. Reads headers only; nothing in the checkpoint is executed.")
    inspect.add_argument("path", type=Path, metavar="PATH",
                         help="a ckpt-<step> directory, or a run or checkpoints directory "
                         "(its newest checkpoint)")
    inspect.add_argument("--verify", action="store_true",
                         help="also check every file against its SHA-256 in the manifest")
    inspect.add_argument("--no-config", action="store_true", help="leave out the run's config")


def _add_export_command(commands: Any) -> None:
    """The ``cadence export`` subcommand and its arguments."""
    export = commands.add_parser(
        "export", help="write a checkpoint's model as one safetensors file (FSDP2's too)",
        description="Writes OUT/model.safetensors: whole tensors by the model's own names, "
        "safetensors-readable without cadence; config.json beside them for a transformers model.")
    export.add_argument("run", type=Path, metavar="RUN", help="a run directory")
    export.add_argument("--checkpoint", metavar="WHICH", default="latest",
                        help="latest (default), best, or a path (as cadence eval's)")
    export.add_argument("--out", "-o", type=Path, metavar="DIR", required=True,
                        help="the folder to write model.safetensors into (created if needed)")
    export.add_argument("--raw", action="store_true",
                        help="the trained weights of a checkpoint, not its EMA average (in a run "
                        "with trainer.ema.enabled; by default what the run evaluates is "
                        "written)")
    export.add_argument("--experiment", "-e", metavar="EXPERIMENT",
                        help="the module of the run's task, where its params.yaml cannot name "
                        "it (a task defined in a script): MODULE:NAME or path/to/file.py:NAME, "
                        "NAME an experiment or a function returning the run's ExperimentConfig")


def _add_prepare_data_command(commands: Any) -> None:
    """The ``cadence prepare-data`` subcommand and its arguments."""
    prepare = commands.add_parser(
        "prepare-data", help="tokenize text files into a folder of token shards",
        description="Each input file becomes one token file (a text file one document, a .jsonl "
        "file one document per line). The folder's manifest is written last and the folder "
        "renamed into place, so a preparation that dies leaves nothing read as prepared. Train "
        "from it with --set task.train_data.input_path=DIR.")
    prepare.add_argument("inputs", nargs="+", metavar="INPUT",
                         help="text or .jsonl files, or globs of them")
    prepare.add_argument("--out", "-o", type=Path, required=True, metavar="DIR",
                         help="the folder to write (it must not exist)")
    prepare.add_argument("--tokenizer", "-t", default="bytes", metavar="PATH",
                         help="a tokenizer.json, a transformers tokenizer folder, or bytes "
                         "(default: bytes); read locally, nothing downloaded")
    prepare.add_argument("--workers", "-j", type=int, default=os.cpu_count() or 1,
                         metavar="N", help="files tokenized at once (default: the CPU count)")
    prepare.add_argument("--text-key", default="text", metavar="KEY",
                         help="the field of a .jsonl line that holds its text (default: text)")


def _prepare_data(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from cadence.data.prepare import input_files, prepare_data

    total = len(input_files(args.inputs))
    with tqdm(total=total, unit="file", desc="prepare-data", disable=not sys.stderr.isatty()
              ) as bar:
        prepared = prepare_data(args.inputs, args.out, args.tokenizer, args.workers,
                                args.text_key, progress=lambda name: bar.update(1))
    print(f"Prepared {prepared.num_tokens} tokens in {prepared.num_documents} documents from "
          f"{total} files into {prepared.folder} ({prepared.dtype}, vocabulary "
          f"{prepared.tokenizer['vocab_size']}). Train from it with --set "
          f"task.train_data.input_path={prepared.folder}")
    return 0


def _add_goodput_command(commands: Any) -> None:
    """The ``cadence goodput`` subcommand and its arguments."""
    goodput = commands.add_parser(
        "goodput", help="where a run's time went: goodput, badput by cause, each attempt",
        description="Reads the run's timeline (timeline/ in the run directory) across every "
        "attempt -- crashes, restarts, resizes -- and says how much of the wall time trained "
        "steps that survived, where the rest went, and how each attempt ended.")
    goodput.add_argument("run", type=Path, metavar="RUN", help="a run directory")
    goodput.add_argument("--json", action="store_true",
                         help="print one JSON object instead of the table")


def _inspect(args: argparse.Namespace) -> int:
    from cadence.engine.inspection import describe_checkpoint

    lines = describe_checkpoint(args.path, verify=args.verify, config=not args.no_config)
    try:
        print("\n".join(lines))
        sys.stdout.flush()
    except BrokenPipeError:  # `cadence inspect ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _export(args: argparse.Namespace) -> int:
    from cadence.task.chosen_weights import EVALUATED, RAW
    from cadence.task.config_files import load_run_config
    from cadence.task.model_export import export_model

    config = None  # with the run's params.yaml, the model names, ties and configures them
    params = RunDirectory(args.run).params
    if args.run.is_dir() and params.is_file():
        try:
            config = (load_run_config(params, args.experiment) if args.experiment is not None
                      else _load(argparse.Namespace(experiment=None, config_file=[],
                                                    overrides=[]), args.run))
        except ConfigError as error:  # the weights need no config: said, then exported
            fix = ("" if args.experiment is not None else " Name the module of its task with "
                   "-e MODULE:NAME or -e path/to/file.py:NAME to build its model.")
            print(f"cadence export: the run's config cannot be loaded ({error}); its weights are "
                  "exported as saved, with the config.json of its best export where it has "
                  f"one.{fix}", file=sys.stderr)
    print(export_model(args.run, args.out, args.checkpoint, config,
                       RAW if args.raw else EVALUATED).summary())
    return 0


def _goodput(args: argparse.Namespace) -> int:
    import json

    from cadence.records.goodput import format_report, run_goodput

    report = run_goodput(args.run)
    text = (json.dumps(report.to_json(), allow_nan=False) if args.json
            else "\n".join(format_report(report, str(args.run))))
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `cadence goodput ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _smoothing_weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; pass a weight in "
                                         "[0, 1), e.g. 0.6.") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1); pass e.g. 0.6.")
    return value


def _add_progress_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--progress", dest="progress", action="store_true", default=None,
                       help="always show the progress bar")
    group.add_argument("--no-progress", dest="progress", action="store_false",
                       help="never show the progress bar (plain log lines instead)")


# ---------------------------------------------------------------------------- run directories


def _latest_step(model_dir: Path) -> int | None:
    latest = CheckpointDirectory(RunDirectory(model_dir).checkpoints, None).latest()
    return latest.step if latest is not None else None


def _runs_of(experiment: str) -> list[Path]:
    if not RUNS_DIR.is_dir():
        return []
    return sorted((p for p in RUNS_DIR.glob(f"{experiment}-*")
                   if RunDirectory(p).params.is_file()), key=lambda p: p.name)


def _train_dir(config: Any) -> Path:
    """The newest unfinished run of this experiment with the same config, else a new one."""
    from cadence.task.config import ExperimentConfig
    from cadence.task.config_files import config_differences, load_run_config

    runs = _runs_of(config.experiment)
    if runs:
        newest = runs[-1]
        try:  # read with this config's classes: no module it records is imported
            saved = load_run_config(RunDirectory(newest).params,
                                    ExperimentConfig(task=type(config.task)()))
        except ConfigError:
            saved = None
        step = _latest_step(newest)
        if (saved is not None and not config_differences(saved, config)
                and (step or 0) < config.trainer.train_steps):
            print(f"Resuming {newest} (step {step or 0} of {config.trainer.train_steps}).",
                  file=sys.stderr)
            return newest
    name = f"{config.experiment or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = RUNS_DIR / name
    suffix = 1
    while path.exists():
        suffix += 1
        path = RUNS_DIR / f"{name}-{suffix}"
    return path


# ---------------------------------------------------------------------------- commands


@contextlib.contextmanager
def _logging(progress: bool) -> Iterator[None]:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s  %(message)s", datefmt="%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    loop_logger = logging.getLogger("cadence.loop")
    if progress:  # the bar shows what the per-loop lines would say
        loop_logger.setLevel(logging.WARNING)
    try:
        if progress:
            from tqdm.contrib.logging import logging_redirect_tqdm

            with logging_redirect_tqdm(loggers=[logger]):
                yield
        else:
            yield
    finally:
        logger.removeHandler(handler)
        loop_logger.setLevel(logging.NOTSET)


def _model_dir_argument(text: str) -> Path:
    """``--model-dir``'s value: a path, never empty (``Path("")`` is the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"is empty; pass the directory of a run, e.g. "
                                         f"{RUNS_DIR}/<experiment>-<time>")
    return Path(text)


def _check_model_dir(model_dir: Path | None) -> None:
    if model_dir is not None and model_dir.exists() and not model_dir.is_dir():
        raise ConfigError(f"--model-dir {str(model_dir)!r} is a file; pass the directory of a "
                          f"run, e.g. {RUNS_DIR}/<experiment>-<time>.")
    if model_dir is not None and (model_dir / "manifest.json").is_file():
        raise ConfigError(f"--model-dir {str(model_dir)!r} is a checkpoint, not a run: pass "
                          f"the run directory that holds it (--model-dir "
                          f"{model_dir.parent.parent}).")


def _load(args: argparse.Namespace, model_dir: Path | None) -> Any:
    """The config of a command: for an existing run, the run's own ``params.yaml`` is the base
    (a run continues, and is evaluated, as it was configured; ``--config-file`` and ``--set``
    go on top, and a change is refused unless allowed), unless ``--experiment`` names another
    experiment; else the experiment's defaults. For a run of a config built by hand (its task
    in a script), ``--experiment`` names the module of its task, and the run's own config is
    loaded over that experiment's.

    A run of an experiment of one's own module (``-e mymodels:NAME``) imports that module again
    as its ``params.yaml`` records it, which is said first (`cadence.task.module_experiments`
    says what is imported from a record, and what is refused)."""
    from cadence.task.config_files import experiment_of, load_config, load_run_config
    from cadence.task.module_experiments import spelled, split_spelling

    saved = RunDirectory(model_dir).params if model_dir is not None else None
    named = args.experiment
    if named is not None and (parts := split_spelling(named)) is not None:
        named = spelled(*parts)  # ./mymodels.py:NAME is mymodels.py:NAME
    if saved is not None and saved.is_file():
        try:
            recorded = experiment_of(saved, run=True)
        except ConfigError:  # a config built by hand, of a task not registered here
            if named is None:
                raise
            recorded = None
        if named in (None, recorded) or not isinstance(recorded, str):
            # The run's own config; for a config built by hand, -e names the module of its
            # task (a script's, which the run cannot record an import of).
            parts = split_spelling(recorded) if isinstance(recorded, str) else None
            if named is None and parts is not None and process_rank() == 0:
                print(f"Importing {parts[0]}: {saved} records it as the module of experiment "
                      f"{parts[1]}.", file=sys.stderr)
            return load_run_config(saved, named, args.config_file, args.overrides)
    return load_config(named, args.config_file, args.overrides)


def _summary(run: RunDirectory, logs: dict[str, Any]) -> None:
    """What a run prints at its end: once, from rank 0 of a torchrun job."""
    from cadence.core.logs import format_logs

    if process_rank() != 0:
        return
    if logs:
        print(f"Evaluation: {format_logs(logs)}")
    ledger_path = run.best / "info.json"
    if ledger_path.is_file():
        from cadence.engine.exporter import read_ledger

        try:  # a run that did not evaluate has not read it yet
            ledger = read_ledger(ledger_path)
        except CheckpointError as error:
            print(f"Best export: none readable. {error}")
            ledger = {}
        if ledger.get("exports"):
            top = ledger["exports"][0]
            weights = ledger_path.parent / top["path"] / "model.safetensors"
            print(f"Best export: step {top['step']}, {ledger['metric']} = {top['value']:.6g}: "
                  f"{weights}")
    print(f"Run directory: {run.root}  (TensorBoard: tensorboard --logdir {run.root})")


def _chosen_by_rank_zero(config: Any, choose: Any) -> Path:
    """`choose(config)` on rank 0, the same path on every rank of a torchrun job (each rank
    would otherwise name its own run directory)."""
    from cadence.core.rank import world_size

    if world_size() == 1:
        return Path(choose(config))
    from cadence.engine.distributed import broadcast_object
    from cadence.engine.runtime import init_distributed, local_device

    init_distributed(config.runtime.collective_timeout,
                     local_device(config.runtime.device, "runtime.device"),
                     setting="runtime.collective_timeout")
    return Path(broadcast_object(str(choose(config)) if process_rank() == 0 else None))


def _train(args: argparse.Namespace) -> int:
    from cadence.task.config_files import run_directory
    from cadence.task.module_experiments import spelled
    from cadence.task.train_lib import run_experiment

    _check_model_dir(args.model_dir)
    config = _load(args, args.model_dir)
    model_dir = args.model_dir or _chosen_by_rank_zero(config, _train_dir)
    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    if process_rank() == 0:
        experiment = spelled(config.experiment_module, config.experiment) or "(custom)"
        print(f"Experiment {experiment}, mode {args.mode}, "
              f"run directory {model_dir}", file=sys.stderr)
    with _logging(progress):
        _, logs = run_experiment(config, args.mode, model_dir, progress_bar=progress,
                                 allow_config_change=args.allow_config_change)
    _summary(run_directory(config, model_dir), logs)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from cadence.task.config_files import run_directory
    from cadence.task.train_lib import run_experiment

    model_dir = args.model_dir
    if model_dir is None:
        from cadence.task.module_experiments import split_spelling
        from cadence.task.registry import DEFAULT_EXPERIMENT

        experiment = args.experiment or DEFAULT_EXPERIMENT
        runs = _runs_of((split_spelling(experiment) or ("", experiment))[1])
        if not runs:
            raise ConfigError(f"No run of {experiment!r} under {RUNS_DIR}/: pass --model-dir.")
        model_dir = runs[-1]
    _check_model_dir(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(f"{str(model_dir)!r} does not exist: pass the directory of a run, "
                          f"e.g. {RUNS_DIR}/<experiment>-<time>.")
    config = _load(args, model_dir)
    with _logging(False):
        _, logs = run_experiment(config, args.mode, model_dir, progress_bar=False,
                                 checkpoint=args.checkpoint)
    _summary(run_directory(config, model_dir), logs)
    return 0


def _experiments(args: argparse.Namespace) -> int:
    from cadence.task.registry import DEFAULT_EXPERIMENT, experiments

    for name, description in experiments().items():
        marker = " (default)" if name == DEFAULT_EXPERIMENT else ""
        print(f"{name}{marker}\n    {description}")
    return 0


def _config(args: argparse.Namespace) -> int:
    from cadence.task.config_files import config_to_yaml

    model_dir = args.model_dir
    _check_model_dir(model_dir)
    if model_dir is not None and not RunDirectory(model_dir).params.is_file():
        raise ConfigError(f"{str(model_dir)!r} holds no {RunDirectory(model_dir).params.name}: "
                          f"pass the directory of a run, e.g. {RUNS_DIR}/<experiment>-<time>.")
    print(config_to_yaml(_load(args, model_dir)), end="")
    return 0


def _plot_input(path: Path) -> Any:
    """What `read_run` reads from `path`, which must hold scalars.

    Raises:
        ConfigError: for a path that does not exist, a file, or a directory without scalars
            (naming the run directories it holds, if any).
    """
    from cadence.writers.reading import is_run_directory, read_run

    if not path.exists():
        raise ConfigError(f"{str(path)!r} does not exist: pass run directories, e.g. "
                          f"{RUNS_DIR}/<experiment>-<time>.")
    if not path.is_dir():
        raise ConfigError(f"{str(path)!r} is a file: pass run directories, e.g. "
                          f"{RUNS_DIR}/<experiment>-<time>.")
    run = read_run(path)
    if not run.series:
        runs = sorted(str(p) for p in path.iterdir() if p.is_dir() and is_run_directory(p))
        hint = (f" It holds run directories ({', '.join(runs[:3])}"
                f"{', ...' if len(runs) > 3 else ''}): pass them." if runs else
                " Is it a run directory? Its train/ and eval/ summaries are written as the run "
                "trains (metrics.jsonl or TensorBoard event files).")
        raise ConfigError(f"{str(path)!r} holds no scalars.{hint}")
    return run


def _plot(args: argparse.Namespace) -> int:
    from cadence.task.plot import plot_runs, select_metrics

    runs = [_plot_input(path) for path in args.run_dirs]
    try:
        metrics = select_metrics(runs, args.metrics)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    out = args.out if args.out is not None else args.run_dirs[0] / "plots"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file: pass a directory for the PNGs (it "
                          "is created if it does not exist).")
    try:
        paths = plot_runs(runs, out, metrics, args.smooth, log_scale=args.log_y)
    except ModuleNotFoundError as error:
        if error.name != "matplotlib":
            raise
        print(f"cadence: error: {error}", file=sys.stderr)
        return 2
    for run in runs:
        resumes = ", ".join(f"{r.reason} at step {r.step}" for r in run.resumes) or "no resumes"
        best = (f"best export at step {run.best.step} ({run.best.metric} = {run.best.value:.6g})"
                if run.best is not None else "no best export")
        print(f"{run.root}: {len(run.metrics)} scalars ({run.source}), {resumes}, {best}",
              file=sys.stderr)
    for path in paths:
        print(path)
    return 0


def _leave_the_job() -> None:
    """Destroys the process group of a torchrun job while everything is still alive: left to
    interpreter exit, gloo's threads may still hold work whose tensors need the interpreter,
    and a rank then aborts after a run that went well ("terminate called without an active
    exception")."""
    runtime = sys.modules.get("cadence.engine.runtime")
    if runtime is not None:
        runtime.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``cadence`` command; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help (0), or a mistake in the arguments (2): printed
        return done.code if isinstance(done.code, int) else 2
    try:
        return _run_command(args)
    finally:
        # After the command's exception is handled and dropped: its traceback holds the frames
        # of the trainer, whose DDP module would keep the process group alive past its
        # destruction, into interpreter exit.
        _leave_the_job()


def _run_command(args: argparse.Namespace) -> int:
    command = {"train": _train, "eval": _eval, "experiments": _experiments,
               "config": _config, "plot": _plot, "inspect": _inspect,
               "goodput": _goodput, "export": _export,
               "prepare-data": _prepare_data}[args.command]
    try:
        if args.command in ("train", "eval"):  # under srun, every rank knows its place at once
            adopt_launch_environment()
        return command(args)
    except Preempted as stop:
        where = f"; checkpoint {stop.checkpoint}" if stop.checkpoint else ""
        then = ("The Slurm job is requeued: it resumes from there when it runs again."
                if stop.requeued else "Run the same command again to resume.")
        if process_rank() == 0:  # every rank stopped at the same step, with the same checkpoint
            print(f"Stopped by a signal{where}. {then}", file=sys.stderr)
        return int(stop.code) if isinstance(stop.code, int) else 1
    except (ConfigError, CheckpointError, HookError, MissingMetricError,
            RunLockedError) as error:
        print(f"cadence: error: {error}", file=sys.stderr)
        return 2
    except (FloatingPointError, JobFailure) as error:
        one_line = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        print(f"cadence: error: {one_line}", file=sys.stderr)
        return 1
    except Exception as error:
        problem = environment_problem(error)
        if problem is None:
            raise  # a bug: its traceback is what to report
        print(f"cadence: error: {problem}", file=sys.stderr)
        return 1


def environment_problem(error: BaseException) -> str | None:
    """One line for a failure of the environment (a full disk, a permission, out of memory)
    with what to do, or None for anything else. What was saved before it stays: checkpoints
    are committed atomically. A training run says its own (`cadence.StorageError`, which names
    what failed and the newest good checkpoint); this line is for the rest (an export's
    ``--out`` on a full disk), whichever writer's error type says it
    (`cadence.core.storage.storage_cause`)."""
    fix = "then run the same command again: what was saved before is kept"
    cause = storage_cause(error)
    if cause is not None:
        where = f": {cause.filename!r}" if cause.filename else ""
        advice = FIXES[cause.errno]  # type: ignore[index]
        return (f"{cause.strerror or cause}{where}. {advice[:1].upper()}{advice[1:]} (or pass "
                f"another --model-dir), {fix}.")
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if isinstance(error, MemoryError) or "out of memory" in text.lower() or (
            "can't allocate memory" in text):
        return (f"Out of memory ({text}). Make the model or the batch smaller (e.g. "
                "--set task.train_data.global_batch_size=...), or spread it over more devices "
                f"(runtime.strategy=fsdp2, runtime.activation_checkpointing=true), {fix}.")
    return None


if __name__ == "__main__":
    sys.exit(main())
