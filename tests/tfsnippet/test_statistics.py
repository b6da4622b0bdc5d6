"""StatisticsCollector (seed 004): tfsnippet's running mean and variance, per element of a
shape, with a weight per value."""

import numpy as np
import pytest
import torch

from cadence.tfsnippet.statistics import StatisticsCollector


def test_tfsnippet_statistics_collector_keeps_statistics_per_element_of_its_shape():
    collector = StatisticsCollector(shape=(3, 2))
    values = np.arange(24).reshape([4, 3, 2])
    collector.collect(values[0])
    collector.collect(values[1], weight=2)
    collector.collect(torch.as_tensor(values[2:]), weight=[3, 4])  # a batch of two values
    np.testing.assert_allclose(collector.mean, [[12, 13], [14, 15], [16, 17]])
    np.testing.assert_allclose(collector.square, [[180, 205], [232, 261], [292, 325]])
    np.testing.assert_allclose(collector.var, collector.square - collector.mean ** 2)
    np.testing.assert_allclose(collector.stddev, np.sqrt(collector.var))
    assert (collector.counter, collector.weight_sum) == (4, 10.0)
    unweighted = StatisticsCollector(shape=(3, 2))
    unweighted.collect(values)
    np.testing.assert_allclose(unweighted.mean, [[9, 10], [11, 12], [13, 14]])
    with pytest.raises(ValueError, match=r"do not end with the collector's shape \(3, 2\)"):
        collector.collect(np.zeros([4, 2, 3]))


def test_tfsnippet_statistics_collector_takes_a_weight_per_value():
    collector = StatisticsCollector()
    collector.collect([2, 1, 7], weight=[1, 3, 6])
    assert collector.mean == pytest.approx(4.7)
    assert collector.square == pytest.approx(30.1)
    assert (collector.counter, collector.weight_sum) == (3, 10.0)
    collector.reset()
    collector.collect([2, 1, 7, 6])
    assert (collector.mean, collector.var, collector.counter) == (4.0, 6.5, 4)


def test_tfsnippet_statistics_collector_ignores_an_empty_array():
    for collector in (StatisticsCollector(), StatisticsCollector(shape=(2,))):
        collector.collect(np.zeros([0, *collector.shape]))
        assert not collector.has_value and collector.counter == 0


def test_tfsnippet_statistics_collector_treats_an_empty_weight_as_one():
    scalars = StatisticsCollector()
    scalars.collect([1.0, 2.0], weight=[])
    scalars.collect(3.0, weight=np.array([]))
    assert (scalars.mean, scalars.weight_sum, scalars.counter) == (2.0, 3.0, 3)
    rows = StatisticsCollector(shape=(2,))
    rows.collect([[1.0, 10.0], [3.0, 30.0]], weight=[])
    np.testing.assert_allclose(rows.mean, [2.0, 20.0])
    assert rows.weight_sum == 2.0
