"""`build_dataloader`: each process's share of a dataset, as a `DataConfig` describes it."""

import re

import pytest

import cadence
from cadence.data.sharding import build_dataloader


def test_a_global_batch_that_does_not_divide_over_the_ranks_is_one_config_error():
    params = cadence.DataConfig(global_batch_size=8, is_training=True)
    with pytest.raises(cadence.ConfigError, match=re.escape(
            "task.train_data.global_batch_size (got 8) is not divisible by the 3 processes of "
            "this job: set it to a multiple of 3, e.g. task.train_data.global_batch_size=6")):
        build_dataloader(list(range(30)), params, cadence.InputContext(3, 0, 3))
