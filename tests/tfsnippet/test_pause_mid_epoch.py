"""A run paused in the middle of an epoch (Ctrl-C, SIGTERM) and continued is the uninterrupted
run: the epoch's rest -- its validation, its end events, a per-epoch learning-rate schedule,
early stopping's choice of the best epoch -- happens once, in the run that finishes it."""

import os
import signal

import pytest
import torch
from torch import nn

import cadence
from cadence.tfsnippet.events import EventKeys


def digits_like(seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(96, 8, generator=generator)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def train(run_dir, trace, signal_at=None, signum=signal.SIGINT, max_epoch=6):
    """The migration guide's program: validation in the epoch's body, a per-epoch learning-rate
    schedule stepped on AFTER_EPOCH (tfsnippet's AnnealingVariable), the best epoch kept.
    `trace` gets ("step", step, lr) for every step and ("valid", epoch, loss) for every
    validation; at global step `signal_at` the process gets `signum`."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    x, y = digits_like()
    flow = cadence.DataFlow.arrays([x[:64], y[:64]], batch_size=16, shuffle=True)
    with cadence.TrainLoop(model, max_epoch=max_epoch, early_stopping=True,
                           valid_metric_name="valid_loss", checkpoint_dir=run_dir,
                           checkpoint_epoch_freq=1, print_func=lambda line: None,
                           checkpoint_save_objects={"optimizer": optimizer,
                                                    "schedule": schedule}) as loop:
        loop.events.on(EventKeys.AFTER_EPOCH, lambda _: schedule.step())
        for epoch in loop.iter_epochs():
            for step, (batch_x, batch_y) in loop.iter_steps(flow):
                loss = nn.functional.cross_entropy(model(batch_x), batch_y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                trace.append(("step", step, optimizer.param_groups[0]["lr"]))
                if step == signal_at:
                    os.kill(os.getpid(), signum)
            with torch.no_grad():
                valid_loss = nn.functional.cross_entropy(model(x[64:]), y[64:]).item()
            trace.append(("valid", epoch, valid_loss))
            loop.collect_metrics(valid_loss=valid_loss)
    return loop.best_valid_metric, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_pause_in_mid_epoch_then_resume_gives_the_uninterrupted_trace(tmp_path, signum):
    uninterrupted = []
    best, weights = train(tmp_path / "a", uninterrupted)
    paused = []
    with pytest.raises(cadence.Preempted):
        train(tmp_path / "b", paused, signal_at=10, signum=signum)  # epoch 3's second step
    assert paused[-1] == ("step", 10, 0.1) and ("valid", 3, paused[-1][2]) not in paused
    assert [e for e in paused if e[0] == "valid"] == [e for e in uninterrupted
                                                      if e[0] == "valid"][:2]
    resumed = []
    best_resumed, weights_resumed = train(tmp_path / "b", resumed)
    assert resumed[0] == ("step", 11, 0.1)  # it went on from the checkpoint of step 10
    assert paused + resumed == uninterrupted  # learning rates and validations, step by step
    assert best_resumed == best
    assert all(torch.equal(a, b) for a, b in zip(weights, weights_resumed))
