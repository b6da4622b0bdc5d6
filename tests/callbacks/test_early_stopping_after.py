"""`EarlyStopping(after="evaluation")`: checked after each Controller evaluation, never at an
epoch's end (the Task front-end's ``trainer.early_stopping``)."""

import pytest
from fakes import CountingEvaluator, CountingTrainer

from cadence.callbacks import EarlyStopping
from cadence.core import Controller


def test_early_stopping_after_evaluations_stops_at_the_first_one_without_improvement():
    trainer = CountingTrainer()
    evaluator = CountingEvaluator(trainer)  # always 0.5: the second evaluation does not improve
    stopper = EarlyStopping("eval/accuracy", patience=1, after="evaluation")
    controller = Controller(trainer=trainer, evaluator=evaluator, steps_per_loop=5,
                            callbacks=[stopper])
    controller.train_and_evaluate(100, eval_interval=10)
    assert evaluator.evaluated_at == [10, 20] and trainer.global_step == 20
    assert stopper.mode == "max" and stopper.best_step == 10
    assert "did not improve for 1 evaluations" in controller.state.stop_reason
    assert "on_epoch_end" not in stopper.active_hooks


def test_early_stopping_after_something_else_is_refused():
    with pytest.raises(ValueError, match=r"^`after` \(got 'step'\) must be 'epoch' or "
                                         r"'evaluation'\.$"):
        EarlyStopping("loss", after="step")
    assert "on_eval_end" not in EarlyStopping("loss").active_hooks  # per epoch: as before
