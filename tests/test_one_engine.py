"""One engine under every front-end: the Controller, the tensorpack trainers and TrainLoop give
callbacks the same RunState, and share one checkpoint path."""

import pytest
import torch
from torch import nn

import cadence
from cadence.callbacks import ModelSaver, ScheduledHyperParamSetter
from cadence.tensorpack import SimpleTrainer

BATCHES = [(torch.ones(2, 1), torch.ones(2, 1))] * 2  # two batches: an epoch is two steps


class Epochs(cadence.Callback):
    """Records (hook, epoch, global step) of the epoch hooks, and the learning rate at each
    epoch's end."""

    def __init__(self, optimizer):
        self.optimizer, self.calls, self.rates = optimizer, [], []

    def on_epoch_begin(self, state):
        self.calls.append(("begin", state.epoch, state.global_step))

    def on_epoch_end(self, state):
        self.calls.append(("end", state.epoch, state.global_step))
        self.rates.append(self.optimizer.param_groups[0]["lr"])


class Regression(cadence.StandardTrainer):
    def __init__(self):
        super().__init__(BATCHES)
        self.model = nn.Linear(1, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_step(self, iterator):
        x, y = next(iterator)
        loss = nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()


# Each front-end trains 3 epochs of 2 steps with the callbacks `make(optimizer)` returns.


def under_the_controller(make):
    trainer = Regression()
    callbacks = make(trainer.optimizer)
    cadence.Controller(trainer=trainer, steps_per_loop=3, callbacks=callbacks).train(6)
    return callbacks


def under_tensorpack(make):
    model = nn.Linear(1, 1)
    trainer = SimpleTrainer()
    trainer.setup_graph(BATCHES, lambda x, y: nn.functional.mse_loss(model(x), y),
                        lambda params: torch.optim.SGD(params, lr=0.1), model=model)
    callbacks = make(trainer.optimizer)
    trainer.train(callbacks=callbacks, steps_per_epoch=2, max_epoch=3)
    return callbacks


def under_train_loop(make):
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    callbacks = make(optimizer)
    with cadence.TrainLoop(model, max_epoch=3, callbacks=callbacks,
                           print_func=lambda line: None) as loop:
        for _ in loop.iter_epochs():
            for _, (x, y) in loop.iter_steps(BATCHES):
                loss = nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    return callbacks


FRONT_ENDS = [under_the_controller, under_tensorpack, under_train_loop]


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_epochs_are_numbered_from_one_and_every_begin_has_its_end(front_end):
    (epochs,) = front_end(lambda optimizer: [Epochs(optimizer)])
    assert epochs.calls == [("begin", 1, 0), ("end", 1, 2), ("begin", 2, 2), ("end", 2, 4),
                            ("begin", 3, 4), ("end", 3, 6)]


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_a_schedule_by_epoch_acts_in_the_same_epoch_in_every_front_end(front_end):
    _, epochs = front_end(lambda optimizer: [
        ScheduledHyperParamSetter("learning_rate", [(2, 0.01)], optimizer=optimizer),
        Epochs(optimizer)])
    assert epochs.rates == [0.1, 0.1, 0.01]  # (2, 0.01): after epoch 2 completes


def test_model_saver_checkpoint_dir_is_where_a_run_saves_and_resumes(tmp_path):
    class Steps(cadence.Callback):
        def __init__(self):
            self.run = 0

        def on_step_end(self, state):
            self.run += 1

    def run(max_epoch):
        model = nn.Linear(1, 1)
        trainer = SimpleTrainer(logdir=tmp_path / "logs")
        trainer.setup_graph(BATCHES, lambda x, y: nn.functional.mse_loss(model(x), y),
                            lambda params: torch.optim.SGD(params, lr=0.1), model=model)
        steps = Steps()
        trainer.train(callbacks=[ModelSaver(checkpoint_dir=tmp_path / "elsewhere"), steps],
                      steps_per_epoch=2, max_epoch=max_epoch)
        return trainer, steps.run

    run(max_epoch=2)
    resumed, steps_run = run(max_epoch=3)
    assert (resumed.global_step, steps_run) == (6, 2)  # continued from step 4, not from 0
    saved = sorted(p.name for p in (tmp_path / "elsewhere").iterdir())
    assert saved == ["ckpt-2", "ckpt-4", "ckpt-6"]
    assert not (tmp_path / "logs" / "checkpoints").exists()


# ---------------------------------------------------------------------------- one copy of each


PACKAGE = __import__("pathlib").Path(cadence.__file__).parent

OTHER_OWNERS = {
    ("engine/state_file.py", "ordered._metadata"): "torch's state-dict metadata, by its name",
    ("engine/external_metrics.py", "metric._update_count"): "torchmetrics' own counter, which "
                                                            "restoring its states must set",
    ("engine/external_metrics.py", "metric._computed"): "torchmetrics' cached result, dropped "
                                                        "with it",
}
"""Private attributes of objects that are not cadence's, written where their library gives no
other way."""


def package_lines():
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.lstrip().startswith(">>>"):  # a docstring's example of a user's code
                yield path.relative_to(PACKAGE).as_posix(), number, line.split("#")[0]


def test_no_module_writes_another_object_s_private_attribute():
    """A private attribute has one writer: its own class (``self._x = ...``). Nothing sets one
    from outside -- by assignment, ``setattr`` or a first-call check installed on it."""
    import re

    assignment = re.compile(r"\b(?!self\b|cls\b)([a-z_]\w*)\.(_[a-z]\w*)\s*(\+|-)?=[^=]")
    installed = re.compile(r"\b(?:setattr|check_first_call)\((?!self\b)\w+, \"_")
    found = [f"{path}:{number}: {line.strip()}" for path, number, line in package_lines()
             if ((match := assignment.search(line)) is not None
             and (path, f"{match.group(1)}.{match.group(2)}") not in OTHER_OWNERS)
             or installed.search(line)]
    assert found == []


def test_no_method_is_shadowed_by_another_object_s_on_the_instance():
    """``self.collect_metrics = self._report.collect_metrics`` hid the class's method behind an
    attribute to save a call: a method is the class's, or it is not one."""
    import re

    shadow = re.compile(r"\bself\.(\w+)\s*=\s*self\.\w+\.\1\b(?!\()")
    assert [f"{path}:{number}" for path, number, line in package_lines()
            if shadow.search(line)] == []


def test_the_task_s_default_forward_is_written_once():
    """`default_train_loss` is the one place a batch is split, the model called and the task's
    loss built for training (the Trainer's executor and `Task.train_step` both run it)."""
    import re

    sources = {path.relative_to(PACKAGE).as_posix(): path.read_text()
               for path in PACKAGE.rglob("*.py")}
    forwards = [(path, name) for path, text in sources.items()
                for name, body in re.findall(r"\n    ?def (\w+)\((.*?)(?=\n    ?def |\Z)", text,
                                             re.S)
                if "call_model(" in body and "build_losses(" in body]
    assert forwards == []  # the loss is built by task_loss, called from default_train_loss
    callers = [path for path, text in sources.items() if "default_train_loss(" in text]
    assert sorted(callers) == ["task/task.py", "task/trainer.py"]
