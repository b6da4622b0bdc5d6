from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fakes import TinyClassifier, make_loader

import cadence


class Recorder(cadence.StandardTrainer, cadence.StandardEvaluator):
    """Records the order of template calls and the batches it sees."""

    def __init__(self, train_data, eval_data=(), options=None, eval_options=None):
        cadence.StandardTrainer.__init__(self, train_data, options)
        cadence.StandardEvaluator.__init__(self, eval_data, eval_options)
        self.calls: list[Any] = []

    _TRACKING_IGNORED = frozenset({"calls"})

    def train_loop_begin(self):
        self.calls.append("begin")

    def train_step(self, iterator: Iterator[Any]) -> None:
        self.calls.append(next(iterator))

    def train_loop_end(self):
        self.calls.append("end")
        return {"steps": self.global_step}

    def eval_begin(self):
        return []

    def eval_step(self, iterator):
        return next(iterator)

    def eval_reduce(self, state=None, step_outputs=None):
        return [*state, step_outputs]

    def eval_end(self, state):
        return {"seen": state}


def test_train_runs_the_template_and_the_iterator_persists_across_calls():
    runner = Recorder([1, 2, 3, 4, 5])
    assert runner.train(2) == {"steps": 2}
    assert runner.train(2) == {"steps": 4}
    assert runner.calls == ["begin", 1, 2, "end", "begin", 3, 4, "end"]


def test_exhausted_data_starts_a_new_epoch():
    runner = Recorder([1, 2, 3])
    runner.train(7)
    assert runner.calls[1:-1] == [1, 2, 3, 1, 2, 3, 1]
    # two passes done, the third running: `epoch` is the running one, as in every front-end
    assert runner.epochs_completed == 2 and runner.epoch == 3 and runner.global_step == 7


def test_stop_at_end_of_data_ends_training_cleanly():
    runner = Recorder([1, 2, 3], options=cadence.StandardTrainerOptions(stop_at_end_of_data=True))
    assert runner.train(10) == {"steps": 3}
    assert runner.epoch == 1
    assert runner.train(2) == {"steps": 5}  # the next call starts the next pass


def test_a_one_shot_iterator_fails_with_a_clear_error_instead_of_spinning():
    runner = Recorder(iter([1, 2]))
    with pytest.raises(ValueError, match="iterated only once"):
        runner.train(5)


def test_evaluate_to_exhaustion_always_reduces():
    runner = Recorder([], eval_data=[10, 20, 30])
    assert runner.evaluate(-1) == {"seen": [10, 20, 30]}
    assert runner.evaluate(2) == {"seen": [10, 20]}  # a fresh iterator per evaluation


def test_eval_reduce_runs_when_eval_begin_returns_none():
    class NoState(Recorder):
        def eval_begin(self):
            return None

        def eval_reduce(self, state=None, step_outputs=None):
            return (state or 0) + step_outputs

    assert NoState([], eval_data=[1, 2, 3]).evaluate(-1) == {"seen": 6}


def test_persistent_eval_iterator_continues_between_evaluations():
    options = cadence.StandardEvaluatorOptions(recreate_iterator_for_each_eval=False)
    runner = Recorder([], eval_data=[1, 2, 3, 4], eval_options=options)
    assert runner.evaluate(2) == {"seen": [1, 2]}
    assert runner.evaluate(2) == {"seen": [3, 4]}


def test_an_evaluation_that_ran_no_step_says_so(caplog):
    runner = Recorder([], eval_data=[])
    assert runner.evaluate(-1) == {"seen": []}
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "The evaluation ran no step: the evaluation data (list) yielded no batch, so its logs "
        "cover nothing."]


def test_evaluation_runs_without_gradients():
    class Grad(Recorder):
        def eval_step(self, iterator):
            next(iterator)
            return torch.is_grad_enabled()

    assert Grad([], eval_data=[0]).evaluate(-1) == {"seen": [False]}


@pytest.mark.parametrize("bad", [-2, 1.5, "3"])
def test_bad_num_steps_are_rejected(bad):
    with pytest.raises(ValueError, match="num_steps"):
        Recorder([1]).train(bad)
    with pytest.raises(ValueError, match="num_steps"):
        Recorder([1]).evaluate(bad)


def test_train_iterator_is_the_iterator_whose_position_a_checkpoint_saves():
    runner = Recorder([1, 2, 3])
    runner.train(2)
    assert runner.train_iterator is runner.checkpoint_items()["train_data"]
    position = runner.train_iterator.state_dict()
    runner.train(1)
    runner.train_iterator.load_state_dict(position)
    runner.train(1)
    assert runner.calls[-2] == 3  # the third batch again, from the restored position


def test_options_must_be_the_options_class():
    with pytest.raises(TypeError, match="StandardTrainerOptions"):
        Recorder([1], options={"compile_step": True})


def test_step_and_epoch_callbacks_fire_through_the_controller():
    calls = []

    class Hooks(cadence.Callback):
        def on_step_end(self, state):
            calls.append(("step", state.global_step))

        def on_epoch_end(self, state):
            calls.append(("epoch", state.epoch))

    runner = Recorder([1, 2])
    controller = cadence.Controller(trainer=runner, steps_per_loop=3, callbacks=[Hooks()])
    controller.train(3)
    assert calls == [("step", 1), ("step", 2), ("epoch", 1), ("step", 3)]


def test_a_trainers_epoch_is_the_one_its_callbacks_see_as_in_every_front_end():
    """`epoch` means the running epoch everywhere: `StandardTrainer.epoch`, `RunState.epoch`,
    tensorpack's `epoch_num`, `TrainLoop.epoch`; `epochs_completed` counts finished ones."""
    seen = []

    class Hooks(cadence.Callback):
        def on_step_end(self, state):
            seen.append((state.epoch, runner.epoch, runner.epochs_completed))

    runner = Recorder([1, 2])
    controller = cadence.Controller(trainer=runner, steps_per_loop=3, callbacks=[Hooks()])
    controller.train(3)
    assert seen == [(1, 1, 0), (1, 1, 1), (2, 2, 1)]
    assert controller.progress is runner.progress and runner.clock.progress is runner.progress


def test_data_exhaustion_ends_controller_training_cleanly():
    runner = Recorder([1, 2, 3], options=cadence.StandardTrainerOptions(stop_at_end_of_data=True))
    controller = cadence.Controller(trainer=runner, steps_per_loop=2)
    controller.train(100)
    assert runner.global_step == 3


def test_examples_per_step_comes_from_the_loader():
    assert TinyClassifier(make_loader(batch_size=8)).examples_per_step == 8


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo's tracing warns about torch internals
def test_compiled_step_trains_like_the_eager_one():
    pytest.importorskip("torch._dynamo")
    eager = TinyClassifier([(torch.randn(4, 4), torch.tensor([0, 1, 2, 0]))])
    compiled = TinyClassifier(eager.train_dataset,
                              options=cadence.StandardTrainerOptions(compile_step=True))
    compiled.model.load_state_dict(eager.model.state_dict())
    compiled.model.eval(), eager.model.eval()  # no dropout: identical updates expected
    eager.train_loop_begin = compiled.train_loop_begin = lambda: None
    eager.train(2)
    compiled.train(2)
    for a, b in zip(eager.model.parameters(), compiled.model.parameters()):
        torch.testing.assert_close(a, b)


def test_the_training_loop_adds_no_host_syncs_between_log_points(monkeypatch):
    class Sgd(cadence.StandardTrainer):
        def __init__(self, data):
            super().__init__(data)
            self.model = torch.nn.Linear(4, 3)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.loss = cadence.Mean()

        def train_step(self, iterator):
            x, y = next(iterator)
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.loss.update(loss)

        def train_loop_end(self):
            return {"loss": self.loss.result()}

    class Count(cadence.Callback):  # hooks steps and epochs, so those paths run too
        def on_step_end(self, state):
            pass

        def on_epoch_end(self, state):
            pass

    # A list of batches: a DataLoader draws its per-epoch shuffle seeds with .item() on CPU
    # tensors, which a hand-written loop over it does too.
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    trainer = Sgd([(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)])
    cadence.Controller(trainer=trainer, steps_per_loop=5, callbacks=[Count()])
    with cadence.debug.count_host_syncs() as syncs:
        logs = trainer.train(10)  # crosses two epoch boundaries
    assert syncs.count == 0, syncs.calls
    assert float(logs["loss"]) > 0


def test_compile_options_are_checked_when_the_options_are_made():
    with pytest.raises(ValueError, match="`compile_mode` .* must be one of None, default"):
        cadence.StandardTrainerOptions(compile_step=True, compile_mode="fastest")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device"):
            cadence.StandardTrainerOptions(cuda_graphs=True)
        with pytest.raises(ValueError, match="needs a CUDA device"):
            cadence.StandardEvaluatorOptions(cuda_graphs=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_step_captured_in_cuda_graphs_trains_like_the_eager_one():
    def run(options):
        torch.manual_seed(0)
        x = torch.randn(64, 4, device="cuda")
        y = torch.randint(0, 3, (64,), device="cuda")
        trainer = TinyClassifier([(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)],
                                 options=options)
        trainer.model.cuda()
        trainer.train(16)
        return trainer.model[0].weight.detach().cpu()

    eager = run(None)
    graphed = run(cadence.StandardTrainerOptions(cuda_graphs=True))
    torch.testing.assert_close(graphed, eager, rtol=1e-4, atol=1e-5)


def test_prefetch_to_device_hands_train_step_batches_moved_one_ahead():
    pulled = []

    def source():
        for i in range(3):
            pulled.append(i)
            yield torch.tensor([i])

    class Batches:
        def __iter__(self):
            return source()

    options = cadence.StandardTrainerOptions(prefetch_to_device="cpu")
    runner = Recorder([torch.tensor([9])], options=options)
    runner.train_dataset = Batches()  # the setter keeps the option
    runner.train(1)
    assert pulled == [0, 1]  # the second batch is fetched while the first is used
    runner.train(2)
    assert [t.item() for t in runner.calls if isinstance(t, torch.Tensor)] == [0, 1, 2]


class MultiTask(cadence.StandardTrainer, cadence.StandardEvaluator):
    """Reads one batch of every dataset per step, from a mapping of iterators."""

    def __init__(self, train_data, eval_data=None, options=None):
        cadence.StandardTrainer.__init__(self, train_data, options)
        cadence.StandardEvaluator.__init__(self, eval_data)
        self.seen = []

    _TRACKING_IGNORED = frozenset({"seen"})

    def train_step(self, iterator):
        self.seen.append((next(iterator["a"]), next(iterator["b"]["c"])))

    def eval_step(self, iterator):
        return next(iterator["a"]) + next(iterator["b"])

    def eval_reduce(self, state=None, step_outputs=None):
        return [*(state or []), step_outputs]

    def eval_end(self, state=None):
        return {"sums": state}


def test_orbit_standard_runners_take_nested_datasets_and_hand_the_step_nested_iterators(
        tmp_path):
    """Orbit's StandardTrainer / StandardEvaluator take a nest (here: dicts) of datasets and
    give the step the same structure of iterators; training datasets repeat each on its own,
    and each one's position is checkpointed."""
    datasets = {"a": [1, 2, 3], "b": {"c": [10, 20]}}
    trainer = MultiTask(datasets, eval_data={"a": [1, 2], "b": [5, 6, 7]})
    trainer.train(3)
    assert trainer.seen == [(1, 10), (2, 20), (3, 10)]
    assert trainer.evaluate(-1) == {"sums": [6, 8]}  # until one of them is exhausted
    manager = cadence.CheckpointManager(trainer, tmp_path)
    manager.save(3)
    trainer.train(2)
    resumed = MultiTask(datasets)
    cadence.CheckpointManager(resumed, tmp_path).restore(tmp_path / "ckpt-3")
    resumed.train(2)
    assert resumed.seen == trainer.seen[3:] == [(1, 20), (2, 10)]
    with pytest.raises(ValueError, match="stop_at_end_of_data"):  # which dataset's end?
        MultiTask(datasets, options=cadence.StandardTrainerOptions(stop_at_end_of_data=True))


def test_eval_steps_per_second_counts_the_steps_that_ran_not_those_requested():
    import time

    class Slow(TinyClassifier):
        def eval_step(self, iterator):
            time.sleep(0.02)
            return super().eval_step(iterator)

    runner = Slow(make_loader(), eval_data=make_loader(n=24, batch_size=8))  # 3 batches
    logs = cadence.Controller(evaluator=runner).evaluate(1000)  # the data runs out first
    assert runner.last_eval_steps == 3
    assert logs["steps_per_second"] < 3 / 0.06 * 1.01  # 3 steps of >= 20 ms, not 1000


class _Linear(cadence.StandardTrainer, cadence.StandardEvaluator):
    """A compiled linear classifier with a loss metric (training) and an accuracy (evaluation),
    both updated inside the compiled steps."""

    def __init__(self, data, options, eval_options):
        cadence.StandardTrainer.__init__(self, data, options)
        cadence.StandardEvaluator.__init__(self, data, eval_options)
        self.model = torch.nn.Linear(4, 3)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loss = cadence.Mean()
        self.accuracy = cadence.Mean()

    def train_loop_begin(self):
        self.loss.reset()

    def train_step(self, iterator):
        x, y = next(iterator)
        # zero_grad first: Dynamo checks `.grad` of a non-leaf loss that crosses a graph break
        # (torch warns about that, an error under this suite's filter)
        self.optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.loss.update(loss)

    def train_loop_end(self):
        return {"loss": self.loss.result()}

    def eval_begin(self):
        self.accuracy.reset()

    def eval_step(self, iterator):
        x, y = next(iterator)
        self.accuracy.update((self.model(x).argmax(-1) == y).float())

    def eval_end(self):
        return {"accuracy": self.accuracy.result()}


def test_compiled_steps_compile_in_the_first_loop_and_never_again(compile_counter):
    from fakes import make_classification

    backend = compile_counter
    x, y = make_classification(32)
    batches = [(x[i:i + 2], y[i:i + 2]) for i in range(0, 32, 2)]  # passes of 16 batches
    runner = _Linear(batches, cadence.StandardTrainerOptions(compile_step=True),
                     cadence.StandardEvaluatorOptions(compile_step=True))
    runner.train(3)  # the first loop
    runner.evaluate(-1)  # and a whole evaluation: 16 steps
    compiled, ran = backend.compiles, backend.runs
    assert 0 < compiled <= 6  # not one per step (of training or of the evaluation)
    for _ in range(8):  # 40 more steps, across passes, and 8 more evaluations
        logs = runner.train(5)
        runner.evaluate(-1)
    assert backend.compiles == compiled  # no recompilation: not per step, not per loop
    assert backend.runs - ran >= 40 + 8 * 16  # and the compiled graphs ran every step
    assert float(logs["loss"]) > 0
    eager = _Linear(batches, None, None)  # the metrics count as they do eagerly
    eager.model.load_state_dict(runner.model.state_dict())
    eager.train_dataset = runner.train_dataset = batches[:4]
    eager.train(4), runner.train(4)
    assert float(runner.loss.result()) == pytest.approx(float(eager.loss.result()), rel=1e-5)
    assert float(runner.evaluate(-1)["accuracy"]) == float(eager.evaluate(-1)["accuracy"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_step_that_cannot_be_captured_in_cuda_graphs_is_a_clear_error():
    from cadence.engine.compile import compile_step

    weight = torch.ones(4, 4, device="cuda")

    def step(x):
        return (x.to("cuda") @ weight).sum()  # a CPU tensor in the graph: cannot be captured

    graphed = compile_step(step, cuda_graphs=True)
    with pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph"):
        for _ in range(3):
            graphed(torch.ones(4, 4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_metrics_in_a_step_captured_in_cuda_graphs_count_like_eager_ones():
    from fakes import make_classification

    def run(options, eval_options):
        torch.manual_seed(0)
        x, y = make_classification(64)
        batches = [(x[i:i + 8].cuda(), y[i:i + 8].cuda()) for i in range(0, 64, 8)]
        runner = _Linear(batches, options, eval_options)
        runner.model.cuda()
        losses = [float(runner.train(4)["loss"]) for _ in range(4)]
        return losses, float(runner.evaluate(-1)["accuracy"]), runner.model.weight.cpu()

    eager = run(None, None)
    graphed = run(cadence.StandardTrainerOptions(cuda_graphs=True),
                  cadence.StandardEvaluatorOptions(cuda_graphs=True))
    assert graphed[0] == pytest.approx(eager[0], rel=1e-4)
    assert graphed[1] == eager[1]
    torch.testing.assert_close(graphed[2], eager[2], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("where", ["on the device", "on the host, prefetched"])
def test_on_cuda_the_controller_loop_makes_no_host_syncs_between_log_points(where):
    from fakes import make_classification

    x, y = make_classification(64)
    if where == "on the device":
        x, y = x.cuda(), y.cuda()
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]
    options = cadence.StandardTrainerOptions(prefetch_to_device="cuda")
    runner = _Linear(batches, options, None)
    runner.model.cuda()
    controller = cadence.Controller(trainer=runner, steps_per_loop=20)
    controller.train(20)  # warm-up: accumulators, optimizer state, the side stream
    with cadence.debug.count_host_syncs() as syncs:  # CUDA's sync debug mode is on too
        runner.train(20)  # a loop between two log points, across passes
    assert syncs.count == 0, syncs.calls


def test_a_heal_that_jumps_mid_loop_ends_training_at_its_step_and_warns_of_nothing(caplog):
    """A replica group's heal (`RunClock.adopt`) in a Controller's loop: the global step jumps,
    the loop ends where it was aimed (here the end of training), and the Controller does not
    read the jump as a trainer that miscounts its steps."""
    import logging

    class Heals(Recorder):
        def train_step(self, iterator):
            super().train_step(iterator)
            if self.global_step == 3:  # the step in flight joins a group at step 7
                self.clock.adopt({**self.progress.state_dict(), "global_step": 7})

    trainer = Heals(list(range(100)))
    controller = cadence.Controller(trainer=trainer, steps_per_loop=10)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        controller.train(10)
    assert trainer.global_step == 10  # 3 run, 7 adopted in the 4th, then steps 9 and 10
    assert trainer.calls.count("begin") == 1 and len(
        [call for call in trainer.calls if isinstance(call, int)]) == 6
    assert "advanced the global step" not in caplog.text


# ---------------------------------------------------------------------------- seed 000's runner


class GlobalStepRunner(cadence.StandardTrainer, cadence.StandardEvaluator):
    """orbit/standard_runner_test.py's runners: train_loop_end and eval_end return
    `self.global_step` -- a number, or (`as_tensor`) a scalar tensor: an `orbit.runner.Output`."""

    def __init__(self, as_tensor=False):
        cadence.StandardTrainer.__init__(self, [1, 2, 3])
        cadence.StandardEvaluator.__init__(self, [1, 2])
        self.as_tensor = as_tensor

    def _output(self):
        return torch.tensor(self.global_step) if self.as_tensor else self.global_step

    def train_step(self, iterator):
        next(iterator)

    def train_loop_end(self):
        return self._output()

    def eval_step(self, iterator):
        return next(iterator)

    def eval_end(self, *args):
        return self._output()


@pytest.mark.parametrize("as_tensor", [False, True])
def test_train_loop_end_and_eval_end_may_return_a_number_or_a_scalar_tensor_as_orbit_s(
        as_tensor, tmp_path, caplog):
    runner = GlobalStepRunner(as_tensor)
    assert int(runner.train(4)) == 4 and int(runner.evaluate(-1)) == 4  # as Orbit returns them
    controller = cadence.Controller(trainer=runner, evaluator=runner, steps_per_loop=2,
                                    summary_dir=str(tmp_path / "train"),
                                    eval_summary_dir=str(tmp_path / "eval"))
    logs = controller.train_and_evaluate(train_steps=10, eval_interval=5)
    assert runner.global_step == 10 and "steps_per_second" not in logs  # evaluated to the end
    said = [r.getMessage() for r in caplog.records if "not a mapping of logs" in r.getMessage()]
    assert said == [  # once each, on the host (no summary of a bare number)
        f"GlobalStepRunner.{hook}() returned int 5, not a mapping of logs: it is returned as it "
        "is, and no summary is written of it (return {name: value, ...} to have values "
        "written)." for hook in ("train", "evaluate")]
    assert logs == {}


class Wrapped(cadence.StandardTrainer):
    """A user's `train` around Orbit's: counts its calls and adds to the output."""

    def __init__(self):
        super().__init__([1, 2, 3])
        self.calls = []

    _TRACKING_IGNORED = frozenset({"calls"})

    def train_step(self, iterator):
        next(iterator)

    def train_loop_end(self):
        return {"loss": 1.0}

    def train(self, num_steps):
        self.calls.append(num_steps)
        output = super().train(num_steps)
        return {**output, "wrapped": 1.0}


class OwnLoop(Wrapped):
    """A `train` that replaces the loop: two half loops of its own, one output."""

    def train(self, num_steps):
        self.calls.append(num_steps)
        self.train_steps(num_steps // 2)
        self.train_steps(num_steps - num_steps // 2)
        return {"halves": 2.0}


@pytest.mark.parametrize("runner_class", [Wrapped, OwnLoop])
def test_the_controller_calls_a_runner_s_own_train_where_it_overrides_it(runner_class,
                                                                         tmp_path):
    runner = runner_class()
    logs = []

    class Logs(cadence.Callback):
        def on_loop_end(self, state, loop_logs):
            logs.append(sorted(k for k in loop_logs if not k.endswith("_per_second")))

    cadence.Controller(trainer=runner, steps_per_loop=4, callbacks=[Logs()]).train(10)
    assert runner.calls == [4, 4, 2] and runner.global_step == 10
    assert logs == [["halves"]] * 3 if runner_class is OwnLoop else [["loss", "wrapped"]] * 3


def test_the_controller_calls_an_evaluator_s_own_evaluate():
    class Counted(GlobalStepRunner):
        evaluations = 0

        def evaluate(self, num_steps):
            type(self).evaluations += 1
            return {"wrapped": super().evaluate(num_steps)}

    runner = Counted()
    logs = cadence.Controller(evaluator=runner).evaluate(-1)
    assert Counted.evaluations == 1 and logs == {"wrapped": 0}


def test_after_a_heal_past_boundaries_checkpoints_and_evaluations_stay_on_their_multiples():
    """A group that heals in the middle of a loop jumps past checkpoint and evaluation
    boundaries the live groups trained: it neither saves nor evaluates at the step it lands on
    (ckpt-24, an evaluation at 24 before this), and goes on at the next multiples."""
    from fakes import FakeCheckpointManager

    evaluated = []

    class Heals(Recorder):
        def train_step(self, iterator):
            super().train_step(iterator)
            if self.global_step == 3:  # the step in flight joins the groups at step 23
                self.clock.adopt({**self.progress.state_dict(), "global_step": 23})

        def eval_end(self, *state):
            evaluated.append(self.global_step)
            return {"n": 1.0}

    trainer = Heals(list(range(1000)), eval_data=list(range(1000)))
    manager = FakeCheckpointManager(trainer, checkpoint_interval=10)
    controller = cadence.Controller(trainer=trainer, evaluator=trainer, steps_per_loop=10,
                                    checkpoint_manager=manager)
    controller.train_and_evaluate(60, eval_steps=1, eval_interval=10)
    assert sorted(manager.saved) == [30, 40, 50, 60]
    assert evaluated == [30, 40, 50, 60]
