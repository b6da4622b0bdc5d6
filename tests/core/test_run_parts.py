"""The Controller's parts used alone: `Evaluations` and `RunCheckpoints` (torch-free fakes)."""

import pytest
from fakes import CountingEvaluator, CountingTrainer, FakeCheckpointManager

from cadence.core.callbacks import Callback, CallbackList, RunState
from cadence.core.evaluation import Evaluations, evaluate_new_checkpoints
from cadence.core.run_checkpoints import RunCheckpoints
from cadence.core.summary import SummaryManager


class Seen(Callback):
    def __init__(self):
        self.saved, self.evaluated = [], []

    def on_checkpoint_saved(self, state, path):
        self.saved.append(path)

    def on_eval_end(self, state, logs):
        self.evaluated.append(dict(logs))


def test_an_evaluation_is_recorded_with_its_step_and_checkpoint(tmp_path):
    trainer, seen = CountingTrainer(), Seen()
    state = RunState()
    summaries = SummaryManager(str(tmp_path), lambda: trainer.global_step, writers=["jsonl"])
    evaluations = Evaluations(CallbackList([seen]), state)
    logs = evaluations.run(CountingEvaluator(trainer), -1, step=30, checkpoint="ckpt-30",
                           summaries=summaries,
                           actions=[lambda output: seen.evaluated.append("action")])
    summaries.close()
    assert logs == {"accuracy": 0.5}
    assert seen.evaluated == ["action", {"accuracy": 0.5}]
    assert state.extra["last_eval"] == {"step": 30, "checkpoint": "ckpt-30"}
    assert state.metrics == {"eval/accuracy": 0.5}
    assert '"checkpoint": "ckpt-30"' in (tmp_path / "metrics.jsonl").read_text()

    restarted = Evaluations(CallbackList(), RunState())
    restarted.load_state_dict(evaluations.state_dict())
    assert (restarted.last_step, restarted.last_logs) == (30, {"accuracy": 0.5})


def test_checkpoints_are_due_on_interval_multiples_and_know_the_weights():
    trainer, seen = CountingTrainer(), Seen()
    manager = FakeCheckpointManager(trainer, checkpoint_interval=10)
    checkpoints = RunCheckpoints(manager, lambda: trainer.global_step, CallbackList([seen]),
                                 RunState())
    trainer.global_step = 7
    assert not checkpoints.due(7)
    trainer.global_step = 12
    assert checkpoints.due(12)
    assert checkpoints.save() == "ckpt-12" and seen.saved == ["ckpt-12"]
    assert checkpoints.saved_now() and checkpoints.weights == "ckpt-12"
    assert not checkpoints.due(15) and checkpoints.due(20)
    trainer.global_step = 15
    assert not checkpoints.saved_now()
    assert checkpoints.restore("ckpt-12") == "ckpt-12" and trainer.global_step == 12
    assert checkpoints.restores == 1


def test_without_a_manager_saving_says_how_to_get_one():
    checkpoints = RunCheckpoints(None, lambda: 0, CallbackList(), RunState())
    assert not checkpoints.due(100)
    with pytest.raises(ValueError, match="needs a checkpoint manager"):
        checkpoints.save()


def test_new_checkpoints_are_evaluated_oldest_first_and_a_damaged_one_is_skipped():
    from cadence.core.checkpoint_dir import CheckpointInfo
    from cadence.core.errors import CheckpointError

    listing = [CheckpointInfo(s, f"ckpt-{s}") for s in (10, 20, 30)]

    def evaluate(path):
        if path == "ckpt-20":
            raise CheckpointError("damaged")
        return {"path": path}

    assert evaluate_new_checkpoints(lambda: listing, evaluate, timeout=0, timeout_fn=None,
                                    stop_at_step=None, poll_interval=0) == {"path": "ckpt-30"}
    assert evaluate_new_checkpoints(lambda: listing, evaluate, timeout=0, timeout_fn=None,
                                    stop_at_step=10, poll_interval=0) == {"path": "ckpt-10"}
