"""The monitors' names: the summaries callback is tensorpack's `TFEventWriter`; its old name,
``TensorBoardWriter`` (also the metric writer's), still works, with a `DeprecationWarning`."""

import pytest

import cadence.callbacks
from cadence.callbacks import TFEventWriter
from cadence.writers.tensorboard import TensorBoardWriter as MetricTensorBoardWriter


def test_the_old_name_TensorBoardWriter_still_gives_TFEventWriter_and_warns():
    with pytest.warns(DeprecationWarning, match="TensorBoardWriter is now TFEventWriter"):
        from cadence.callbacks import TensorBoardWriter
    assert TensorBoardWriter is TFEventWriter
    with pytest.warns(DeprecationWarning, match="import TFEventWriter instead"):
        from cadence.callbacks.monitors import TensorBoardWriter as from_the_module
    assert from_the_module is TFEventWriter
    with pytest.warns(DeprecationWarning):  # each use warns: the alias is not cached
        assert cadence.callbacks.TensorBoardWriter is TFEventWriter


def test_one_class_per_name():
    assert "TensorBoardWriter" not in cadence.callbacks.__all__
    assert TFEventWriter is not MetricTensorBoardWriter
    with pytest.raises(AttributeError, match="has no attribute 'TFEventWriters'"):
        cadence.callbacks.TFEventWriters  # noqa: B018
