"""TokenLoader: one global sequence of samples, whatever the number of data shards; a position
of a few integers that resumes it exactly, at the same or another number of shards; mixtures by
weight."""

import logging

import numpy as np
import pytest
import torch

from cadence.core.errors import CheckpointIncompatibleError, ConfigError
from cadence.data.sharding import InputContext
from cadence.data.token_loader import TokenLoader, build_token_inputs
from cadence.data.token_shards import TokenShards
from cadence.task.config import TokenDataConfig
from tests.data.test_token_shards import nanogpt_bin, prepared

LENGTH = 4


def source(tmp_path, name="train.bin", samples=25, seed=0):
    """A raw token file of `samples` windows whose first token is the sample's number + 1000
    times its seed, so that a window says which sample of which source it is."""
    tokens = np.zeros(samples * LENGTH + 1, dtype=np.uint16)
    tokens[:-1:LENGTH] = np.arange(samples) + 1000 * seed
    tokens.tofile(tmp_path / name)
    return TokenShards.open(str(tmp_path / name), LENGTH)


def ids(batch):
    """The samples of a batch (the first token of each window)."""
    inputs = batch[0]["input_ids"] if isinstance(batch[0], dict) else batch[0]
    return inputs[:, 0].tolist()


def global_batches(sources, steps, shards, weights=None, start=None):
    """`steps` global batches read by `shards` data shards, each the shards' parts in order;
    from the position `start` (the old shards' states) where given."""
    loaders = [TokenLoader(sources, 12, weights=weights, shard_index=r, num_shards=shards)
               for r in range(shards)]
    if start is not None:
        for rank, loader in enumerate(loaders):
            loader.load_resharded(start, rank, shards)
    batches = [[sample for loader in loaders for sample in ids(loader.next_batch())]
               for _ in range(steps)]
    return batches, [loader.state_dict() for loader in loaders]


def test_every_number_of_data_shards_reads_the_same_global_batches(tmp_path):
    sources = [source(tmp_path)]
    one, _ = global_batches(sources, 6, 1)
    for shards in (2, 3, 4, 6, 12):
        assert global_batches(sources, 6, shards)[0] == one, shards


def test_each_epoch_takes_every_sample_once_in_a_new_order(tmp_path):
    sources = [source(tmp_path)]  # 25 samples, 12 a step: batches straddle the epochs
    batches, states = global_batches(sources, 25, 2)
    stream = [sample for batch in batches for sample in batch]
    epochs = [stream[i: i + 25] for i in range(0, 300, 25)]
    assert all(sorted(epoch) == list(range(25)) for epoch in epochs)
    assert epochs[0] != epochs[1] and epochs[0] != list(range(25))
    assert states[0]["samples"] == 300 and states[0]["taken"] == [300]


def test_the_order_is_a_function_of_the_seed_and_shuffle_false_reads_in_order(tmp_path):
    sources = [source(tmp_path)]
    orders = {seed: ids(TokenLoader(sources, 12, seed=seed).next_batch()) for seed in (0, 0, 1)}
    assert len(orders) == 2 and orders[0] != orders[1]
    assert orders[0] == ids(TokenLoader(sources, 12, seed=0).next_batch())
    assert ids(TokenLoader(sources, 12, shuffle=False).next_batch()) == list(range(12))


def test_a_resume_at_two_then_three_then_two_shards_goes_on_with_the_uninterrupted_sequence(
        tmp_path):
    sources = [source(tmp_path)]
    expected, _ = global_batches(sources, 9, 1)
    first, states = global_batches(sources, 3, 2)
    second, states = global_batches(sources, 3, 3, start=states)
    third, _ = global_batches(sources, 3, 2, start=states)
    assert first + second + third == expected


def test_the_same_number_of_shards_resumes_from_its_own_state_bitwise(tmp_path):
    folder = prepared(tmp_path / "data", [list(range(n, n + 3 + n % 7)) for n in range(200)],
                      per_file=[120, 80])
    shards = TokenShards.open(str(folder), LENGTH, packing=True)
    loader = TokenLoader([shards], 12, shard_index=1, num_shards=3, seed=5)
    for _ in range(7):
        loader.next_batch()
    state = loader.state_dict()
    expected = [loader.next_batch() for _ in range(5)]
    resumed = TokenLoader([shards], 12, shard_index=1, num_shards=3, seed=5)
    resumed.load_state_dict(state)
    for want, got in zip(expected, [resumed.next_batch() for _ in range(5)]):
        for key in ("input_ids", "position_ids"):
            assert torch.equal(want[0][key], got[0][key])
        assert torch.equal(want[1], got[1])


def test_a_mixture_keeps_its_weights_within_sampling_tolerance_and_is_deterministic(tmp_path):
    sources = [source(tmp_path, "web.bin", 50, seed=1), source(tmp_path, "code.bin", 30, seed=2),
               source(tmp_path, "books.bin", 20, seed=3)]
    weights = [0.6, 0.2, 0.2]
    batches, states = global_batches(sources, 500, 2, weights)
    samples = np.array([sample for batch in batches for sample in batch])
    stream = samples // 1000
    counts = np.bincount(stream, minlength=4)[1:]
    total = len(stream)
    for count, weight in zip(counts, weights):  # within 4 standard deviations of a binomial
        assert abs(count - weight * total) < 4 * np.sqrt(total * weight * (1 - weight))
    assert states[0]["taken"] == counts.tolist()
    # each source goes through its samples epoch by epoch: every sample once per epoch
    web = samples[stream == 1] % 1000
    assert sorted(web[:50].tolist()) == list(range(50))
    assert global_batches(sources, 20, 3, weights)[0] == batches[:20]  # the same sequence


def test_a_mixture_resumes_and_reshards_exactly(tmp_path):
    sources = [source(tmp_path, "a.bin", 40, seed=1), source(tmp_path, "b.bin", 13, seed=2)]
    expected, _ = global_batches(sources, 12, 1, [3, 1])
    first, states = global_batches(sources, 5, 2, [3, 1])
    second, states = global_batches(sources, 4, 3, [3, 1], start=states)
    third, _ = global_batches(sources, 3, 4, [3, 1], start=states)
    assert first + second + third == expected


def test_changed_weights_on_resume_are_said_in_one_line_and_each_source_goes_on(
        tmp_path, caplog):
    sources = [source(tmp_path, "a.bin", 40, seed=1), source(tmp_path, "b.bin", 13, seed=2)]
    _, states = global_batches(sources, 5, 2, [3, 1])
    loader = TokenLoader(sources, 12, weights=[1, 1])
    with caplog.at_level(logging.WARNING, logger="cadence"):
        loader.load_state_dict(states[0])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "the mixture's weights changed from [3.0, 1.0] to [1.0, 1.0]" in lines[0]
    assert loader.taken == states[0]["taken"]


@pytest.mark.parametrize("change", ["size", "seed", "sources"])
def test_a_resume_on_other_data_is_refused_in_one_line(tmp_path, change):
    sources = [source(tmp_path)]
    _, states = global_batches(sources, 2, 1)
    if change == "size":
        other = TokenLoader([source(tmp_path, "other.bin", 30)], 12)
    elif change == "seed":
        other = TokenLoader(sources, 12, seed=1)
    else:
        other = TokenLoader([*sources, source(tmp_path, "b.bin")], 12, weights=[1, 1])
    with pytest.raises(CheckpointIncompatibleError,
                       match="does not fit this data: .*Resume with the data and seed"):
        other.load_state_dict(states[0])


def test_an_order_this_numpy_draws_otherwise_is_refused(tmp_path):
    sources = [source(tmp_path)]
    _, states = global_batches(sources, 2, 1)
    states[0]["sources"][0]["order"] = "0" * 64  # what another NumPy's permutation would be
    with pytest.raises(CheckpointIncompatibleError, match="drawn again is not the saved one"):
        TokenLoader(sources, 12).load_state_dict(states[0])


def test_old_shards_that_disagree_are_refused(tmp_path):
    sources = [source(tmp_path)]
    _, states = global_batches(sources, 2, 2)
    states[1]["samples"] += 12
    with pytest.raises(CheckpointIncompatibleError, match="saved different positions"):
        TokenLoader(sources, 12).load_resharded(states, 0, 1)


@pytest.mark.parametrize(("arguments", "says"), [
    ({"global_batch_size": 10, "num_shards": 3}, "must be a positive multiple of num_shards"),
    ({"shard_index": 3, "num_shards": 3}, "shard_index"),
    ({"weights": [1.0, 2.0]}, "one positive number per source"),
    ({"weights": [0.0]}, "one positive number per source"),
    ({"packed": True}, "must all be packed or none"),
])
def test_a_loader_that_cannot_be_built_says_why(tmp_path, arguments, says):
    sources, arguments = [source(tmp_path)], dict(arguments)
    if arguments.pop("packed", False):
        folder = prepared(tmp_path / "data", [list(range(10)), list(range(10))])
        sources.append(TokenShards.open(str(folder), LENGTH, packing=True))
        arguments["weights"] = [1, 1]
    with pytest.raises(ValueError, match=says):
        TokenLoader(sources, **{"global_batch_size": 12, **arguments})


def test_a_token_outside_the_models_vocabulary_is_one_line_before_it_reaches_the_model(
        tmp_path):
    nanogpt_bin(tmp_path / "train.bin", 1000)  # GPT-2's ids
    loader = TokenLoader([TokenShards.open(str(tmp_path / "train.bin"), 8)], 4, vocab_size=256)
    with pytest.raises(ValueError, match="outside the model's vocabulary of 256: set the "
                                         "model's vocab_size to at least"):
        loader.next_batch()
    folder = prepared(tmp_path / "data", [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], vocab_size=50257)
    with pytest.raises(ValueError, match="tokenized with a vocabulary of 50257"):
        TokenLoader([TokenShards.open(str(folder), 4)], 4, vocab_size=256)


def test_batches_are_pinned_where_asked(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs CUDA")
    loader = TokenLoader([source(tmp_path)], 4, pin_memory=True)
    inputs, labels = loader.next_batch()
    assert inputs.is_pinned() and labels.is_pinned()


# ---------------------------------------------------------------------------- from a config


def test_build_token_inputs_deals_the_training_data_by_the_input_context(tmp_path):
    source(tmp_path)
    params = TokenDataConfig(input_path=str(tmp_path / "train.bin"), global_batch_size=12,
                             is_training=True, seed=3)
    loader = build_token_inputs(params, InputContext(3, 2, 3), sequence_length=LENGTH)
    assert isinstance(loader, TokenLoader)
    assert (loader.shard_index, loader.num_shards, loader.batch_size, loader.seed) == (2, 3, 4, 3)
    validation = build_token_inputs(
        TokenDataConfig(input_path=str(tmp_path / "train.bin"), global_batch_size=4,
                        is_training=False, drop_remainder=False),
        InputContext(2, 1, 2), sequence_length=LENGTH)
    seen = [sample for batch in validation for sample in ids(batch)]
    assert seen == list(range(1, 25, 2))  # every second sample, in order


@pytest.mark.parametrize(("changes", "says"), [
    ({"input_path": ""}, "task.train_data.input_path is empty"),
    ({"input_weights": [1.0, 2.0]}, "must give one weight per comma-separated entry"),
    ({"global_batch_size": 7}, "global_batch_size \\(got 7\\) is not divisible by the 2"),
    ({"input_path": "nothing/*.bin"}, "task.train_data: input_path 'nothing/\\*.bin' matches"),
])
def test_build_token_inputs_names_the_config_key_of_a_mistake(tmp_path, changes, says):
    source(tmp_path)
    params = TokenDataConfig(**{"input_path": str(tmp_path / "train.bin"),
                                "global_batch_size": 12, "is_training": True, **changes})
    with pytest.raises(ConfigError, match=says):
        build_token_inputs(params, InputContext(2, 0, 2), sequence_length=LENGTH)
