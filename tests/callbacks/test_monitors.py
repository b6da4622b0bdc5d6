"""The monitors' names: the summaries callback is tensorpack's `TFEventWriter`, and
``TensorBoardWriter`` is the metric writer's name alone."""

import pytest

import cadence.callbacks
from cadence.callbacks import TFEventWriter
from cadence.writers.tensorboard import TensorBoardWriter as MetricTensorBoardWriter


def test_one_class_per_name():
    """The callback's old name ``TensorBoardWriter`` went with issue 30 (a deprecated alias of
    a 0.x library that no saved checkpoint needs): it names the metric writer only."""
    assert "TensorBoardWriter" not in cadence.callbacks.__all__
    assert TFEventWriter is not MetricTensorBoardWriter
    with pytest.raises(AttributeError, match="TensorBoardWriter"):
        cadence.callbacks.TensorBoardWriter  # noqa: B018
    with pytest.raises(AttributeError, match="TFEventWriters"):
        cadence.callbacks.TFEventWriters  # noqa: B018
