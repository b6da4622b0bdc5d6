"""Built-in callbacks, usable with every front-end (Controller, Task Trainer, TrainLoop, the
tensorpack-style trainers), and the wrappers that schedule them.

=====================================  =========================================================
callback                               what it does (default: at each epoch's end)
=====================================  =========================================================
`ModelSaver`                           full checkpoint (model, optimizer, data position, RNG,
                                       callbacks), keep the last N (and one every n hours)
`MinSaver`, `MaxSaver`                 export the weights at a new best of a metric (top K)
`InferenceRunner`                      evaluate on held-out data, record the metrics
`ScheduledHyperParamSetter`,           set the learning rate or any optimizer field from a
`HyperParamSetterWithFunc`             schedule or a function of the epoch or step
`StatMonitorParamSetter`               change a hyper-parameter when a metric plateaus
`EstimatedTimeLeft`                    ETA from the median (or mean) time per step of recent
                                       epochs
`ThroughputTracker`                    steps and samples per second
`PeakMemoryTracker`                    peak CUDA memory per epoch, peak host memory
`JSONWriter`, `TFEventWriter`,         monitors: write each epoch's scalars (``stats.jsonl``,
`ScalarPrinter`                        TensorBoard, a log line)
`EarlyStopping`                        stop when a metric stops improving; restore the best
`StopAtTimeLimit`                      stop after a wall-clock budget
`Profiler`                             ``torch.profiler`` traces on a schedule (wait, warmup,
                                       active, repeat) or of a step range
`ModelSummary`                         at the start of training: parameters, trainable, bytes,
                                       a row per top-level module
`cadence.LossGuard`                    NaN/Inf guard: stop (or restore) when the loss diverges
`cadence.ProgressBar`                  tqdm bar with ETA and the latest metrics
=====================================  =========================================================

Scheduling wrappers: `PeriodicTrigger`, `PeriodicCallback`, `EnableCallbackIf`.
"""

from cadence.callbacks.control import EarlyStopping, StopAtTimeLimit
from cadence.callbacks.hyperparams import (
    HyperParamSetter,
    HyperParamSetterWithFunc,
    ScheduledHyperParamSetter,
    StatMonitorParamSetter,
    cosine_schedule,
)
from cadence.callbacks.inference import InferenceRunner
from cadence.callbacks.model_summary import ModelSummary
from cadence.callbacks.monitors import JSONWriter, ScalarPrinter, TFEventWriter
from cadence.callbacks.profiler import Profiler
from cadence.callbacks.savers import MaxSaver, MinSaver, ModelSaver
from cadence.callbacks.scheduling import EnableCallbackIf, PeriodicCallback, PeriodicTrigger
from cadence.callbacks.stats import EstimatedTimeLeft, PeakMemoryTracker, ThroughputTracker

__all__ = [
    "EarlyStopping",
    "EnableCallbackIf",
    "EstimatedTimeLeft",
    "HyperParamSetter",
    "HyperParamSetterWithFunc",
    "InferenceRunner",
    "JSONWriter",
    "MaxSaver",
    "MinSaver",
    "ModelSaver",
    "ModelSummary",
    "PeakMemoryTracker",
    "PeriodicCallback",
    "PeriodicTrigger",
    "Profiler",
    "ScalarPrinter",
    "ScheduledHyperParamSetter",
    "StatMonitorParamSetter",
    "StopAtTimeLimit",
    "TFEventWriter",
    "ThroughputTracker",
    "cosine_schedule",
]

