"""A `Task`'s step hooks, checked at their first step and never again.

What ``train_step``, ``validation_step`` and ``process_metrics`` return is checked at their first
call (the `Trainer` installs `train_step_check` and `validation_check` on its own steps;
`check_task_hooks` the task's) -- a dict with the loss under ``Task.loss``, a scalar loss (with a
gradient where the `Trainer` updates with it), None from ``process_metrics`` -- in one line
naming the hook (``build_losses`` for the loss of the default steps), what it returned and
what it must return (`cadence.core.hook_checks`).

`refuse_a_step_that_trained_nothing`: a Task's overridden ``train_step`` that trains nothing
is an error at its first step, not a run whose weights never move.

A task may override ``train_step`` to update the weights itself (a GAN with two optimizers) and
return detached values; the Trainer then only counts the step. The same override with a loss
computed under ``torch.no_grad()`` or ``.detach()``ed looks alike from outside -- a loss without
gradient -- but updates nothing. What tells them apart is whether the step touched a weight or a
gradient: the version counters torch keeps on every tensor, host-side attributes read without
a device sync, before and after the first step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

import torch

from cadence.core.errors import HookError, HookTypeError, HookValueError
from cadence.core.hook_checks import check_first_call, describe, hook_error
from cadence.core.logs import is_scalar
from cadence.task.task import Task

Marks = list[tuple[int, int, int]]


def update_marks(tensors: Iterable[torch.Tensor]) -> Marks:
    """For each trainable tensor: its version counter, and its gradient's identity and version
    counter. A step that updates a weight in place (``optimizer.step()``, an in-place op under
    ``torch.no_grad()``) or computes gradients (``loss.backward()``) changes some of them."""
    return [(t._version, id(t.grad), -1 if t.grad is None else t.grad._version)
            for t in tensors]


def refuse_a_step_that_trained_nothing(task: Any, before: Marks,
                                       tensors: Iterable[torch.Tensor], updated: bool) -> None:
    """Refuses the first step of `task`'s overridden ``train_step`` if it trained nothing: its
    loss has no gradient for the Trainer to update with (`updated` is False), and the step
    neither updated a weight nor computed a gradient itself (the marks taken `before` it are
    those of `tensors` now). A task that updates the weights itself passes, and so does one
    whose loss keeps its gradient.

    Known limit: a step that writes weights through ``.data`` (which bumps no version counter)
    and calls no ``backward`` is refused although it trained.

    Raises:
        HookValueError: if the step trained nothing while there are weights to train (the
            ``cadence`` command prints it in one line).
    """
    if updated or not before or update_marks(tensors) != before:
        return
    raise HookValueError(
        f"{type(task).__name__}.train_step() returned a loss {task.loss!r} that has no gradient "
        "(requires_grad=False) and updated no weight, so training would change nothing. Was the "
        "loss computed under torch.no_grad() or .detach()ed? Return it with its gradient for "
        "the Trainer to update the weights, or update them in train_step with the optimizer "
        "(and return detached values).")


# ---------------------------------------------------------------- what the step hooks return


def train_step_check(task: Any, default: bool) -> Callable[[Any], None]:
    """The check of what the `Trainer`'s training step returned at its first call: the default
    forward's loss (a message about it names ``build_losses``; it must have a gradient), or the
    logs of a task's own ``train_step`` (a dict with the loss under ``Task.loss``). The Trainer
    installs it on its own step (`cadence.core.hook_checks.check_first_call`)."""
    return partial(_check_default_loss if default else _check_train_logs, task)


def validation_check(task: Any) -> Callable[[Any], None]:
    """The check of what ``validation_step`` returned at its first call: None, or a dict of
    logs whose loss under ``Task.loss`` is a scalar."""
    return partial(_check_validation_logs, task)


def check_task_hooks(task: Any) -> None:
    """Makes the first call of `task`'s ``validation_step`` and ``process_metrics`` check what
    they returned (`cadence.core.hook_checks.check_first_call`): every later call is the
    hook's own, unchecked and at no cost. (Where the `Trainer` compiles its steps, it checks
    its compiled validation step instead: ``process_metrics`` is traced inside it.)"""
    check_first_call(task, "validation_step", validation_check(task))
    check_first_call(task, "process_metrics", partial(_check_process_metrics, task))


def loss_maker(task: Any, step: str) -> str:
    """The hook that made the loss of `task`'s `step` (``"train_step"``,
    ``"validation_step"``): ``build_losses()`` under the default step, else the step."""
    return "build_losses()" if getattr(type(task), step) is getattr(Task, step) else f"{step}()"


def logs_error(task: Any, logs: Any) -> HookError:
    """The error for ``train_step`` logs without the loss under ``task.loss``."""
    what = (f"a {type(logs).__name__} with keys {sorted(map(str, logs))}"
            if isinstance(logs, Mapping) else describe(logs))
    return hook_error(HookTypeError, task, "train_step()", what,
                      f"a dict with the loss under {task.loss!r} (Task.loss)")


def no_gradient_error(task: Any, loss: torch.Tensor) -> HookError:
    """The error for a loss the `Trainer` must update with that has no gradient."""
    return hook_error(
        HookValueError, task, loss_maker(task, "train_step"),
        f"{describe(loss)} without a gradient (requires_grad=False)",
        "a scalar tensor with a gradient, computed from the model's outputs",
        "Does the model have no trainable parameters, or was the loss detached (.detach(), "
        ".item(), torch.no_grad())?")


def _check_loss(task: Any, step: str, loss: Any, needs_gradient: bool) -> None:
    hook = loss_maker(task, step)
    built = hook == "build_losses()"
    got = describe(loss) if built else f"{describe(loss)} under {task.loss!r}"
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise hook_error(HookValueError, task, hook, got,
                             "a scalar tensor (one value) as the loss",
                             "Reduce the per-example losses, e.g. with .mean().")
        if needs_gradient and not loss.requires_grad:
            raise no_gradient_error(task, loss)
        return
    number = is_scalar(loss)
    if not number or (built and needs_gradient):
        raise hook_error(HookTypeError, task, hook, got,
                         "a scalar tensor with a gradient, computed from the model's outputs"
                         if built and needs_gradient else "a scalar tensor as the loss")


def _check_default_loss(task: Any, loss: Any) -> None:
    # The Trainer updates with the loss of the default step, which must have a gradient.
    _check_loss(task, "train_step", loss, needs_gradient=torch.is_grad_enabled())


def _check_train_logs(task: Any, logs: Any) -> None:
    if not isinstance(logs, Mapping) or task.loss not in logs:
        raise logs_error(task, logs)
    # A task's own step may update the weights itself: its loss may have no gradient (see
    # refuse_a_step_that_trained_nothing).
    _check_loss(task, "train_step", logs[task.loss], needs_gradient=False)


def _check_validation_logs(task: Any, logs: Any) -> None:
    if logs is None:
        return
    if not isinstance(logs, Mapping):
        raise hook_error(HookTypeError, task, "validation_step()", describe(logs),
                         f"a dict of logs (with the loss under {task.loss!r} for "
                         "validation_loss), or None")
    if task.loss in logs:
        _check_loss(task, "validation_step", logs[task.loss], needs_gradient=False)


def _check_process_metrics(task: Any, returned: Any) -> None:
    if returned is not None:
        raise hook_error(HookTypeError, task, "process_metrics()", describe(returned),
                         "None: it updates the metrics it is given, in place "
                         "(metric.update_state(labels, outputs))",
                         "To log other values, return them from train_step: the Trainer "
                         "averages its other scalars over each loop.")
