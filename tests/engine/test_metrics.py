import math

import torch

import cadence


def test_mean_weights_each_element():
    mean = cadence.Mean()
    mean.update(torch.tensor([1.0, 2.0, 3.0]))
    mean.update(10.0, weight=3)
    assert float(mean.result()) == (1 + 2 + 3 + 30) / 6


def test_mean_is_nan_before_an_update_and_after_a_reset():
    mean = cadence.Mean()
    assert math.isnan(float(mean.result()))
    mean.update(1.0)
    mean.reset()
    assert math.isnan(float(mean.result()))


def test_updates_do_not_synchronize_with_the_host(monkeypatch):
    mean, total, last = cadence.Mean(), cadence.Sum(), cadence.Last()
    syncs = []
    for name in ("item", "tolist", "__float__", "__bool__", "numpy"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _o=original, _n=name, **k: (syncs.append(_n),
                                                                         _o(self, *a, **k))[1])
    for step in range(5):
        value = torch.tensor(float(step))
        mean.update(value)
        total.update(value)
        last.update(value)
    results = [mean.result(), total.result(), last.result()]
    assert syncs == []
    monkeypatch.undo()
    assert [float(r) for r in results] == [2.0, 10.0, 4.0]


def test_state_round_trips():
    mean = cadence.Mean()
    mean.update(torch.tensor([2.0, 4.0]))
    other = cadence.Mean()
    other.load_state_dict(mean.state_dict())
    assert float(other.result()) == 3.0


def test_a_mean_of_many_scalar_tensors_is_exact_and_holds_a_bounded_number_of_them():
    mean = cadence.Mean()
    values = torch.arange(3000, dtype=torch.float32)
    for value in values[:2500]:  # 0-d tensors: remembered, summed when read or every 1,024
        mean.update(value)
        assert len(mean._remembered.get("total", [])) < cadence.Mean._FOLD_EVERY
    saved = mean.state_dict()  # includes what was only remembered
    resumed = cadence.Mean()
    resumed.load_state_dict(saved)
    for value in values[2500:]:
        resumed.update(value)
    assert float(resumed.result()) == float(values.double().mean())
    resumed.reset()
    resumed.update(torch.tensor(7.0))
    assert float(resumed.result()) == 7.0


def test_accuracy_counts_across_folds_and_resets():
    accuracy = cadence.Accuracy()
    outputs = torch.tensor([[2.0, 1.0], [0.0, 3.0]])
    for step in range(1500):  # each step: one right, and the second right on even steps
        accuracy.update_state(torch.tensor([0, step % 2]), outputs)
    assert float(accuracy.result()) == (1500 + 750) / 3000
    accuracy.reset()
    accuracy.update_state(torch.tensor([1, 1]), outputs)
    assert float(accuracy.result()) == 0.5
