import math

import pytest
import torch

import cadence
from cadence.engine.metrics import Moments


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


def test_updated_says_whether_a_metric_was_ever_updated_reset_or_not():
    mean = cadence.Mean()
    assert not mean.updated
    mean.update(torch.tensor(2.0))
    assert mean.updated
    mean.reset()
    assert mean.updated  # the accumulators are kept, zeroed


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


def _restored(metric_type, update):
    metric = metric_type()
    update(metric)
    restored = metric_type()
    restored.load_state_dict(metric.state_dict())  # a checkpoint loads on the CPU
    return restored


def test_restored_accumulators_move_to_the_device_of_the_next_update():
    # "meta" stands in for a GPU: a resumed run's values live on another device than the
    # checkpoint's tensors, and the accumulators must follow them (not stay on the CPU).
    meta = torch.tensor(1.0, device="meta")
    cases = [
        (cadence.Mean, lambda m: m.update(torch.tensor(2.0)), lambda m: m.update(meta)),
        (cadence.Mean, lambda m: m.update(torch.tensor(2.0)),
         lambda m: m.update(meta.expand(3), weight=torch.ones(3, device="meta"))),
        (Moments, lambda m: (m.update(torch.tensor(2.0)), m.update(3.0)),
         lambda m: m.update(meta)),
        (cadence.Sum, lambda m: m.update(torch.tensor(2.0)), lambda m: m.update(meta)),
        (cadence.Accuracy, lambda m: m.update_state(torch.tensor([0]), torch.eye(2)[:1]),
         lambda m: m.update_state(torch.zeros(1, dtype=torch.long, device="meta"),
                                  torch.zeros(1, 2, device="meta"))),
    ]
    for metric_type, first, then in cases:
        metric = _restored(metric_type, first)
        then(metric)
        assert {acc.device.type for acc in metric._state.values()} == {"meta"}, metric_type


def test_a_metric_that_knows_its_device_restores_onto_it():
    used = cadence.Mean()
    used.update(torch.tensor(1.0, device="meta"))  # a live run's metric, restored in place
    used.load_state_dict(_restored(cadence.Mean, lambda m: m.update(4.0)).state_dict())
    assert {acc.device.type for acc in used._state.values()} == {"meta"}
    given = cadence.Mean(device="meta")
    given.load_state_dict({"total": torch.tensor(4.0), "count": torch.tensor(1.0)})
    assert {acc.device.type for acc in given._state.values()} == {"meta"}


def test_numbers_before_the_first_tensor_follow_it_to_its_device():
    mean = cadence.Mean()
    mean.update(3.0)  # a Python number: accumulated on the CPU until a device is known
    mean.update(torch.ones(2, device="meta"))
    assert {acc.device.type for acc in mean._state.values()} == {"meta"}


def test_updates_inside_a_compiled_function_compile_once_and_count_exactly():
    from torch._dynamo.testing import CompileCounter

    mean, moments, accuracy = cadence.Mean(), Moments(), cadence.Accuracy()
    weighted, total = cadence.Mean(), cadence.Sum()
    counter = CompileCounter()

    def step(x, labels):
        scores = x * 2
        loss = scores.square().mean()
        mean.update(loss)
        moments.update(loss)
        weighted.update(x.sum(-1), weight=torch.ones(x.shape[0]))
        total.update(x)
        accuracy.update_state(labels, scores)
        return loss

    compiled = torch.compile(step, backend=counter)
    losses = []
    x = torch.randn(8, 3)
    labels = x.argmax(-1)
    labels[:3] = (labels[:3] + 1) % 3  # 5 of 8 right
    for i in range(30):  # more steps than torch's recompile limit (8)
        losses.append(compiled(x + i, labels))
    # the first step creates the accumulators; the second compiles with them, and that is all
    assert counter.frame_count == 2
    stacked = torch.stack(losses).double()
    torch.testing.assert_close(mean.result(), stacked.mean().float())
    torch.testing.assert_close(moments.result(), stacked.mean())
    torch.testing.assert_close(moments.variance(), stacked.var(unbiased=False))
    assert float(accuracy.result()) == 5 / 8
    inputs = torch.stack([x + i for i in range(30)])
    torch.testing.assert_close(weighted.result(), inputs.sum(-1).mean())
    torch.testing.assert_close(total.result(), inputs.sum())
    for metric in (mean, moments, accuracy):
        assert not metric._remembered and metric._host_count == 0



def test_accumulators_made_outside_a_graph_are_static_buffers_once_compile_is_in_use():
    import torch._dynamo  # what torch.compile imports

    mean = _restored(cadence.Mean, lambda m: m.update(2.0))
    mean.update(torch.ones(3))
    # A CUDA graph may update a static input in place; an ordinary mutated input would make
    # Inductor skip the graph (mark_static_address sets this attribute).
    assert all(getattr(acc, "_dynamo_static_input_type", None) for acc in mean._state.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_restored_mean_takes_cuda_losses():
    restored = _restored(cadence.Mean, lambda m: m.update(torch.tensor(2.0)))
    for value in (4.0, 6.0):
        restored.update(torch.tensor(value, device="cuda"))  # the hot path, then remembered
    assert restored.result().device.type == "cuda"
    assert float(restored.result()) == 4.0


def test_moments_merge_adds_what_another_saw_as_if_updated_with_it():
    """`Moments.merge`: device values (remembered or summed), host numbers and arrays of one
    collector join another's -- or an empty one's -- with the statistics of one that saw them
    all; the merged one keeps its own."""
    values = [torch.tensor(1.0), 2.5, torch.tensor([3.0, 4.0]), torch.tensor(7.0), 0.5]
    whole, first, second = Moments(), Moments(), Moments()
    for index, value in enumerate(values):
        whole.update(value)
        (first if index < 2 else second).update(value)
    first.merge(second)
    empty = Moments()
    empty.merge(first)
    for merged in (first, empty):
        assert merged.weight() == whole.weight() == 6
        assert float(merged.result()) == pytest.approx(float(whole.result()))
        assert float(merged.stddev()) == pytest.approx(float(whole.stddev()))
    assert second.weight() == 4  # left as it was
