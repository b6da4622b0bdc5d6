"""Every check of an `ExperimentConfig` its values alone decide, in one place, made before
anything is created: the ranges of its values, the names it chooses among, and the settings
that exclude each other.

Types alone let through what cannot train: a negative learning-rate factor trains with a
negative rate, a seed of -1 fails deep inside NumPy, a summary subdirectory of ``../x`` writes
outside the run. `config_problems` lists every value out of its range as ``key: must be <the
range> (got <value>)`` and, where the key alone does not say it, why; `ExperimentConfig.validate`
puts them on one line. Each rule is a row of `RANGES`, so a reader finds a key's range in one
place, and a new field gets its range by adding a row. `choice_problems` checks the names
(an optimizer, a schedule, a writer, a strategy) and the pairs that exclude each other. What the
environment decides -- a device, a path, a run directory -- is checked by
`cadence.task.train_lib` when a run starts.

A `TaskConfig` subclass checks its own fields by overriding `TaskConfig.problems` (with the
rules here: `range_problem`).

>>> from cadence.task.config import ExperimentConfig
>>> config = ExperimentConfig()
>>> config.runtime.seed = -1
>>> list(config_problems(config))
['runtime.seed: must be an integer in [0, 2**32) or null (got -1).']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from cadence.core.files import relative_name
from cadence.core.intervals import is_int
from cadence.core.logs import is_finite_scalar, is_scalar
from cadence.core.run_dir import LOCK_FILE, PARAMS_FILE, RESUMES_FILE
from cadence.core.slurm import signal_name
from cadence.core.summary import WRITERS
from cadence.engine.compile import COMPILE_MODES
from cadence.engine.strategies import PIPELINE_SCHEDULES, STRATEGIES, stages_per_rank

MODES = ("train", "train_and_eval", "train_and_post_eval", "eval", "continuous_eval")
"""What `cadence.run_experiment` can run (see `cadence.task.train_lib`)."""
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad")
SCHEDULES = ("constant", "cosine", "linear", "step", "exponential")
PRECISIONS = (None, "bf16", "fp16")
WANDB_MODES = (None, "online", "offline", "disabled", "shared")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""``runtime.fsdp``'s dtype names, and torch's."""


class Rule(NamedTuple):
    """A range: `holds(value)`, and the phrase that names it ("a positive integer")."""

    holds: Callable[[Any], bool]
    phrase: str


POSITIVE_INT = Rule(lambda v: is_int(v) and v > 0, "a positive integer")
NON_NEGATIVE_INT = Rule(lambda v: is_int(v) and v >= 0, "an integer >= 0")
SEED = Rule(lambda v: is_int(v) and 0 <= v < 2**32, "an integer in [0, 2**32)")
POSITIVE = Rule(lambda v: is_finite_scalar(v) and v > 0, "a positive finite number")
NON_NEGATIVE = Rule(lambda v: is_finite_scalar(v) and v >= 0, "a finite number >= 0")
FRACTION = Rule(lambda v: is_finite_scalar(v) and 0 < v < 1, "a fraction in (0, 1)")
FACTOR = Rule(lambda v: is_finite_scalar(v) and 0 <= v <= 1, "a factor in [0, 1]")
DECAY = Rule(lambda v: is_finite_scalar(v) and 0 <= v < 1, "in [0, 1)")
BETAS = Rule(lambda v: isinstance(v, (list, tuple)) and len(v) == 2
             and all(is_finite_scalar(b) and 0 <= b < 1 for b in v), "a pair of numbers in [0, 1)")
VALIDATION_STEPS = Rule(lambda v: is_int(v) and (v > 0 or v == -1),
                        "positive, or -1 for the whole validation set")
RECOVERY_TRIALS = Rule(lambda v: is_int(v) and v >= -1,
                       "-1 (ignore), 0 (fail) or a positive number of restores")
# .inf allowed, nan not (nan >= 0 is False)
LOSS_BOUND = Rule(lambda v: is_scalar(v) and v >= 0, ">= 0")
SUBDIRECTORY = Rule(relative_name, "a relative path inside the run directory")


def duration_seconds(value: Any) -> float | None:
    """A duration of ``trainer.time_limit`` in seconds: a positive finite number of seconds,
    or ``"HH:MM:SS"`` / ``"DD:HH:MM:SS"``; None for anything else (and for 0).

    >>> duration_seconds(90), duration_seconds("01:30:00"), duration_seconds("1:00:00:00")
    (90.0, 5400.0, 86400.0)
    >>> duration_seconds("90m"), duration_seconds(-1), duration_seconds("00:00:00")
    (None, None, None)
    """
    if isinstance(value, str):
        parts = value.strip().split(":")
        if len(parts) not in (3, 4) or not all(p.isascii() and p.isdigit() for p in parts):
            return None
        seconds = 0.0
        for part, unit in zip(reversed(parts), (1, 60, 3600, 86400)):
            seconds += int(part) * unit
        return seconds or None
    return float(value) if is_finite_scalar(value) and value > 0 else None


DURATION = Rule(lambda v: duration_seconds(v) is not None,
                "a positive number of seconds, or 'HH:MM:SS' or 'DD:HH:MM:SS'")


def optional(rule: Rule) -> Rule:
    """`rule`, or None."""
    return Rule(lambda v: v is None or rule.holds(v), f"{rule.phrase} or null")


def disabled_by_empty(rule: Rule) -> Rule:
    """`rule`, or "" (which disables what the value names)."""
    return Rule(lambda v: v == "" or rule.holds(v), f"{rule.phrase}, or '' to disable it")


_OPT = "trainer.optimizer_config"
_LR = f"{_OPT}.learning_rate"

RANGES: dict[str, tuple[Rule, str]] = {
    # key: (its range, why -- when the key alone does not say it)
    "trainer.train_steps": (NON_NEGATIVE_INT, ""),
    "trainer.steps_per_loop": (POSITIVE_INT, ""),
    "trainer.summary_interval": (optional(POSITIVE_INT), "null: every step"),
    "trainer.checkpoint_interval": (optional(POSITIVE_INT), "null: only at the end"),
    "trainer.max_to_keep": (POSITIVE_INT, ""),
    "trainer.validation_steps": (VALIDATION_STEPS, ""),
    "trainer.validation_interval": (POSITIVE_INT, ""),
    "trainer.continuous_eval_timeout": (optional(NON_NEGATIVE),
                                        "seconds without a new checkpoint; null: no limit"),
    "trainer.validation_summary_subdir": (SUBDIRECTORY, "e.g. eval"),
    "trainer.best_checkpoint_export_subdir": (disabled_by_empty(SUBDIRECTORY), "e.g. best"),
    "trainer.best_checkpoint_max_to_keep": (POSITIVE_INT, ""),
    "trainer.loss_upper_bound": (LOSS_BOUND, "a larger mean training loss is a blow-up; .inf "
                                 "disables the bound"),
    "trainer.recovery_begin_steps": (NON_NEGATIVE_INT, ""),
    "trainer.recovery_max_trials": (RECOVERY_TRIALS, ""),
    "trainer.early_stopping.patience": (POSITIVE_INT, "evaluations without improvement"),
    "trainer.early_stopping.min_delta": (NON_NEGATIVE, ""),
    "trainer.time_limit": (optional(DURATION), "null: no limit"),
    "trainer.ema.decay": (DECAY, ""),
    "trainer.ema.start_step": (NON_NEGATIVE_INT, ""),
    f"{_OPT}.gradient_clip_norm": (optional(POSITIVE), "null: no clipping"),
    f"{_OPT}.gradient_accumulation_steps": (POSITIVE_INT, ""),
    f"{_OPT}.optimizer.learning_rate": (POSITIVE, ""),
    f"{_OPT}.optimizer.weight_decay": (NON_NEGATIVE, ""),
    f"{_OPT}.optimizer.momentum": (NON_NEGATIVE, ""),
    f"{_OPT}.optimizer.betas": (BETAS, "the decay rates of Adam's two moments, e.g. "
                                "[0.9, 0.999]"),
    f"{_OPT}.optimizer.eps": (POSITIVE, "it keeps an update finite where a gradient's second "
                              "moment is 0"),
    f"{_LR}.warmup_steps": (NON_NEGATIVE_INT, ""),
    f"{_LR}.warmup_init_factor": (FACTOR, "the share of the peak learning rate warmup starts "
                                  "from"),
    f"{_LR}.decay_steps": (optional(POSITIVE_INT), "null: until trainer.train_steps"),
    f"{_LR}.end_factor": (FACTOR, "the share of the peak learning rate decay ends at"),
    f"{_LR}.step_size": (POSITIVE_INT, ""),
    f"{_LR}.gamma": (POSITIVE, "the learning rate is multiplied by it; at or below 0 it would "
                     "train with a rate of 0 or a negative one"),
    "runtime.seed": (optional(SEED), ""),
    "runtime.num_threads": (optional(POSITIVE_INT), "null: torch's default"),
    "runtime.collective_timeout": (POSITIVE, "seconds a collective waits for the other ranks"),
    "runtime.parallelism.dp_replicate": (POSITIVE_INT, ""),
    "runtime.parallelism.dp_shard": (Rule(lambda v: is_int(v) and (v > 0 or v == -1),
                                          "a positive integer or -1"),
                                     "-1: what the other degrees leave"),
    "runtime.parallelism.tp": (POSITIVE_INT, ""),
    "runtime.parallelism.pp": (POSITIVE_INT, ""),
    "runtime.parallelism.cp": (POSITIVE_INT, ""),
    "runtime.parallelism.pp_microbatches": (optional(POSITIVE_INT),
                                            "null: as many as the pipeline has stages"),
    "runtime.parallelism.pp_stages_per_rank": (optional(POSITIVE_INT),
                                               "null: 2 for interleaved_1f1b, else 1"),
    "runtime.profiler.wait": (NON_NEGATIVE_INT, ""),
    "runtime.profiler.warmup": (NON_NEGATIVE_INT, ""),
    "runtime.profiler.active": (POSITIVE_INT, "steps recorded in each trace"),
    "runtime.profiler.repeat": (NON_NEGATIVE_INT, "0: until training ends"),
    "runtime.fault_tolerance.replica_id": (optional(NON_NEGATIVE_INT),
                                           "null: the environment's REPLICA_GROUP_ID"),
    "runtime.fault_tolerance.replica_groups": (POSITIVE_INT, ""),
    "runtime.fault_tolerance.min_live_groups": (POSITIVE_INT, ""),
    "runtime.fault_tolerance.timeout": (POSITIVE, "seconds"),
    "runtime.fault_tolerance.quorum_timeout": (POSITIVE, "seconds"),
    "runtime.fault_tolerance.connect_timeout": (POSITIVE, "seconds"),
    **{f"task.{data}.{key}": value
       for data in ("train_data", "validation_data")
       for key, value in {"global_batch_size": (POSITIVE_INT, ""),
                          "num_workers": (NON_NEGATIVE_INT, "0: load in the main process"),
                          "seed": (optional(SEED), "null: from runtime.seed")}.items()},
}
"""Every ranged key of an `ExperimentConfig`, its `Rule` and, where useful, why."""


def value_at(config: Any, key: str) -> Any:
    """The value at a dotted `key` of `config` (``trainer.ema.decay``)."""
    for name in key.split("."):
        config = getattr(config, name)
    return config


def range_problem(key: str, value: Any, rule: Rule, why: str = "") -> str | None:
    """``"key: must be <rule> (why) (got value)."``, or None when `value` is in range."""
    if rule.holds(value):
        return None
    return f"{key}: must be {rule.phrase}{f' ({why})' if why else ''} (got {value!r})."


def config_problems(config: Any) -> Iterable[str]:
    """Every problem of `config` (an `ExperimentConfig`) that its values alone show: each value
    outside its range in `RANGES`, what its task config's `problems` says, then the choices
    among names and the settings that exclude each other."""
    for key, (rule, why) in RANGES.items():
        problem = range_problem(key, value_at(config, key), rule, why)
        if problem is not None:
            yield problem
    yield from config.task.problems()
    yield from choice_problems(config)


def choice_problems(config: Any) -> Iterable[str]:
    """The names `config` chooses that are not among the choices, and the settings that exclude
    each other."""
    trainer, opt = config.trainer, config.trainer.optimizer_config
    if trainer.best_checkpoint_metric_comp not in ("higher", "lower"):
        yield (f"trainer.best_checkpoint_metric_comp: must be 'higher' or 'lower' "
               f"(got {trainer.best_checkpoint_metric_comp!r}).")
    if trainer.early_stopping.mode not in (None, "min", "max"):
        yield (f"trainer.early_stopping.mode: must be null, 'min' or 'max' "
               f"(got {trainer.early_stopping.mode!r}).")
    if opt.optimizer.name not in OPTIMIZERS:
        yield (f"trainer.optimizer_config.optimizer.name: unknown optimizer "
               f"{opt.optimizer.name!r}; valid: {', '.join(OPTIMIZERS)}.")
    if opt.learning_rate.schedule not in SCHEDULES:
        yield (f"trainer.optimizer_config.learning_rate.schedule: unknown schedule "
               f"{opt.learning_rate.schedule!r}; valid: {', '.join(SCHEDULES)}.")
    if trainer.compile_mode not in COMPILE_MODES:
        yield (f"trainer.compile_mode: unknown mode {trainer.compile_mode!r}; valid: null, "
               f"{', '.join(str(m) for m in COMPILE_MODES[1:])}.")
    for key in ("param_dtype", "reduce_dtype"):
        value = getattr(config.runtime.fsdp, key)
        if value is not None and value not in DTYPES:
            yield (f"runtime.fsdp.{key}: must be null, {', '.join(map(repr, DTYPES))} "
                   f"(got {value!r}).")
    if trainer.compile_step and trainer.compile_blocks:
        yield ("trainer.compile_blocks: compiles each block, trainer.compile_step the whole "
               "step; set one of them, not both.")
    if config.runtime.strategy not in STRATEGIES:
        yield (f"runtime.strategy: must be one of {', '.join(STRATEGIES)} "
               f"(got {config.runtime.strategy!r}).")
    unknown = [name for name in config.runtime.writers if name not in WRITERS]
    if unknown:
        yield (f"runtime.writers: unknown writer{'s' if len(unknown) > 1 else ''} "
               f"{', '.join(map(repr, unknown))}; valid: {', '.join(WRITERS)}.")
    if config.runtime.wandb.mode not in WANDB_MODES:
        yield (f"runtime.wandb.mode: must be null, 'online', 'offline', 'disabled' or 'shared' "
               f"(got {config.runtime.wandb.mode!r}).")
    if config.runtime.mixed_precision not in PRECISIONS:
        yield (f"runtime.mixed_precision: must be null, 'bf16' or 'fp16' "
               f"(got {config.runtime.mixed_precision!r}).")
    for key in ("validation_summary_subdir", "best_checkpoint_export_subdir"):
        top = str(getattr(trainer, key)).split("/")[0]
        if top in _RUN_FILES:
            yield (f"trainer.{key}: {top!r} is where the run keeps its own files; pass another "
                   f"name, e.g. {'eval' if key.startswith('validation') else 'best'}.")
    yield from parallelism_problems(config.runtime.parallelism)
    if is_int(config.runtime.parallelism.pp) and config.runtime.parallelism.pp > 1:
        yield from pipeline_problems(config)
    if config.runtime.slurm.signal is not None:
        try:
            signal_name(config.runtime.slurm.signal)
        except ValueError as error:
            yield f"runtime.slurm.signal: {error}"
    yield from fault_tolerance_problems(config.runtime.fault_tolerance,
                                        config.runtime.parallelism)


def fault_tolerance_problems(ft: Any, parallelism: Any) -> Iterable[str]:
    """What ``runtime.fault_tolerance`` asks that cannot be: a replica id past the groups, more
    live groups than groups, a layout inside a group that is not data shards alone."""
    if ft.replica_id is not None and is_int(ft.replica_id) and is_int(ft.replica_groups):
        problem = replica_id_problem(ft.replica_id, ft.replica_groups)
        if problem is not None:
            yield problem
    if is_int(ft.min_live_groups) and is_int(ft.replica_groups) and (
            ft.min_live_groups > ft.replica_groups):
        yield (f"runtime.fault_tolerance.min_live_groups (got {ft.min_live_groups}) must be at "
               f"most runtime.fault_tolerance.replica_groups (got {ft.replica_groups}).")
    if ft.enabled:
        yield from replica_layout_problems(parallelism)


def replica_layout_problems(parallelism: Any) -> Iterable[str]:
    """What a replica group of the fault-tolerant mode cannot be inside: its ranks are data
    shards alone (DDP or FSDP2 over the group), the groups themselves the replicated
    dimension -- tensor parallelism inside a group is not built yet."""
    degrees = {key: getattr(parallelism, key) for key in ("tp", "dp_replicate")}
    for key, degree in degrees.items():
        if is_int(degree) and degree > 1:
            fix = ("the replica groups are the replicated dimension: give each group's "
                   "ranks as dp_shard" if key == "dp_replicate" else
                   "replica groups are built over data shards alone, not yet with tensor "
                   "parallelism inside a group")
            yield (f"runtime.parallelism.{key} (got {degree}) with "
                   f"runtime.fault_tolerance.enabled: {fix}; set {key}=1.")


def parallelism_problems(parallelism: Any) -> Iterable[str]:
    """What ``runtime.parallelism`` asks that cannot be built, whatever the world size (the
    degrees' product is checked against it when the job starts: `cadence.engine.runtime`)."""
    if parallelism.tp_plan != "auto":
        yield (f"runtime.parallelism.tp_plan: must be 'auto' (the model's own plan) "
               f"(got {parallelism.tp_plan!r}); give another plan through Task.parallelize.")
    if parallelism.pp_schedule not in PIPELINE_SCHEDULES:
        yield (f"runtime.parallelism.pp_schedule: must be one of {', '.join(PIPELINE_SCHEDULES)} "
               f"(got {parallelism.pp_schedule!r}).")
        return
    per_rank = parallelism.pp_stages_per_rank
    if parallelism.pp_schedule == "interleaved_1f1b" and per_rank == 1:
        yield ("runtime.parallelism.pp_stages_per_rank: interleaved_1f1b runs several stages "
               "per rank (got 1); set 2 or more, or pp_schedule=1f1b.")
    elif parallelism.pp_schedule != "interleaved_1f1b" and is_int(per_rank) and per_rank > 1:
        yield (f"runtime.parallelism.pp_stages_per_rank: {parallelism.pp_schedule} runs one "
               f"stage per rank (got {per_rank}); set pp_schedule=interleaved_1f1b for more.")
    stages = parallelism.pp * stages_per_rank(parallelism.pp_schedule, per_rank) if is_int(
        parallelism.pp) and (per_rank is None or is_int(per_rank)) else None
    microbatches = parallelism.pp_microbatches
    if parallelism.pp_schedule == "1f1b" and is_int(microbatches) and stages is not None and (
            microbatches < stages):
        yield (f"runtime.parallelism.pp_microbatches (got {microbatches}) must be at least the "
               f"pipeline's stages ({stages}) with pp_schedule=1f1b; give more, or use gpipe.")
    given = parallelism.pp_stage_modules
    if given and stages is not None and parallelism.pp > 1 and len(given) != stages:
        yield (f"runtime.parallelism.pp_stage_modules gives {len(given)} stages and the "
               f"pipeline has {stages} (pp x pp_stages_per_rank): give one list of module names "
               "per stage.")


def pipeline_problems(config: Any) -> Iterable[str]:
    """What pipeline parallelism (``runtime.parallelism.pp`` > 1) cannot be combined with: the
    schedule's microbatches are the step's accumulation, fp16's loss scaling would skip steps
    on some stages and not others, a compiled or replayed step would hide the schedule's
    communication, and replica groups repair whole models."""
    pp = config.runtime.parallelism.pp
    fix = "set it off, or pp=1"
    if config.trainer.optimizer_config.gradient_accumulation_steps != 1:
        yield (f"trainer.optimizer_config.gradient_accumulation_steps: with pp={pp} the "
               "pipeline's microbatches are the accumulation (runtime.parallelism."
               "pp_microbatches splits each batch); set it to 1.")
    if config.runtime.mixed_precision == "fp16":
        yield (f"runtime.mixed_precision: fp16's loss scaling does not work across pp={pp} "
               "pipeline stages (each would decide alone to skip a step); use bf16.")
    for key in ("compile_step", "cuda_graphs"):
        if getattr(config.trainer, key):
            yield (f"trainer.{key}: a pipeline's step is its schedule's sends and receives "
                   f"(pp={pp}); {fix} (trainer.compile_blocks compiles each block).")
    if config.runtime.fault_tolerance.enabled:
        yield (f"runtime.fault_tolerance.enabled: replica groups are not built for pipelines "
               f"(pp={pp}); {fix}.")


def replica_id_problem(replica_id: int, replica_groups: int) -> str | None:
    """What is wrong with a replica group's id among `replica_groups` groups (the config's, or
    ``REPLICA_GROUP_ID`` when a run starts); None when it fits."""
    if replica_id < replica_groups:
        return None
    return (f"runtime.fault_tolerance.replica_id (got {replica_id}) must be below "
            f"runtime.fault_tolerance.replica_groups (got {replica_groups}): groups count "
            "from 0.")


_RUN_FILES = ("checkpoints", "train", PARAMS_FILE, LOCK_FILE, RESUMES_FILE)
"""What a run directory holds that a configured subdirectory must not be (`RunDirectory`)."""
