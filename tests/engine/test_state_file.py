"""The checkpoint payload file: everything a state_dict holds round-trips, nothing is executed,
and damage is found."""

import io
import json
import math
import struct
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from cadence.engine.rng import capture_rng_state
from cadence.engine.state_file import MAGIC, StateFileError, read_state, write_state


def round_trip(state, **kwargs):
    buffer = io.BytesIO()
    digest = write_state(state, buffer)
    buffer.seek(0)
    return read_state(buffer, **kwargs), digest, buffer.getvalue()


def test_what_state_dicts_hold_round_trips_exactly():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(),
        "rng": capture_rng_state(), "plain": (1, 2.5, None, True, "s", b"\x00\xff"),
        "specials": [math.nan, math.inf, -math.inf], 7: "int key", (1, 2): "tuple key",
        "bf16": torch.ones(3, dtype=torch.bfloat16), "scalar": torch.tensor(3),
        "empty": torch.empty(0, 5), "numpy": np.arange(4), "size": torch.Size([2, 3]),
        "dtype": torch.float16, "strided": torch.arange(12.0).reshape(3, 4).t(),
    }
    loaded, _, _ = round_trip(state)
    assert torch.equal(loaded["model"]["0.weight"], state["model"]["0.weight"])
    assert loaded["model"]._metadata == state["model"]._metadata  # module versions kept
    assert isinstance(loaded["model"], OrderedDict)
    assert loaded["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"],
                       state["optimizer"]["state"][0]["exp_avg"])
    assert loaded["plain"] == state["plain"] and loaded[7] == "int key"
    assert math.isnan(loaded["specials"][0]) and loaded["specials"][1:] == [math.inf, -math.inf]
    assert loaded[(1, 2)] == "tuple key" and loaded["size"] == torch.Size([2, 3])
    assert loaded["bf16"].dtype == torch.bfloat16 and loaded["scalar"].item() == 3
    assert loaded["empty"].shape == (0, 5) and loaded["dtype"] is torch.float16
    assert (loaded["numpy"] == np.arange(4)).all()
    assert torch.equal(loaded["strided"], state["strided"])
    new_model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    new_model.load_state_dict(loaded["model"])


def test_lists_and_tuples_of_ints_round_trip_as_they_were():
    """Python's random state (625 ints in a tuple) and lists of indices take the encoder's
    fast path: the same values, the same types, bools still bools beside ints."""
    import random

    state = {"python": random.getstate(), "indices": list(range(1000)), "big": [2**70, -1],
             "mixed": [1, True, (2, False)], "empty": ((), []), "names": [[torch.ones(2)]]}
    loaded, _, _ = round_trip(state)
    assert loaded["python"] == random.getstate() and type(loaded["python"][1]) is tuple
    random.setstate(loaded["python"])  # what a resume does with it
    assert loaded["indices"] == list(range(1000)) and loaded["big"] == [2**70, -1]
    assert loaded["mixed"] == [1, True, (2, False)] and loaded["mixed"][1] is True
    assert loaded["empty"] == ((), []) and torch.equal(loaded["names"][0][0], torch.ones(2))


def test_a_tensor_stored_twice_is_written_once_and_loaded_as_one():
    shared = torch.ones(100)
    loaded, _, data = round_trip({"a": shared, "b": shared})
    assert loaded["a"] is loaded["b"] and len(data) < 2 * 400


def test_objects_that_are_not_plain_state_are_refused_with_their_path():
    class Custom:
        pass

    with pytest.raises(TypeError, match=r"/model/extra is a Custom"):
        write_state({"model": {"extra": Custom()}}, io.BytesIO())


def test_truncation_flipped_bits_and_foreign_files_are_errors():
    state = {"w": torch.arange(1000.0)}
    _, digest, data = round_trip(state)
    with pytest.raises(StateFileError, match="truncated"):
        read_state(io.BytesIO(data[: len(data) // 2]))
    flipped = bytearray(data)
    flipped[-10] ^= 1
    with pytest.raises(StateFileError, match="SHA-256"):
        read_state(io.BytesIO(bytes(flipped)), sha256=digest)
    with pytest.raises(StateFileError, match="not a cadence state file"):
        read_state(io.BytesIO(b"PK\x03\x04 a zip, or a pickle"))


def test_reading_builds_values_and_never_calls_anything():
    """The header is JSON: a node that is not one of the plain kinds is refused."""
    header = json.dumps({"version": 1, "tree": {"x": ["os.system", "touch pwned"]},
                         "tensors": []}).encode()
    data = MAGIC + struct.pack("<Q", len(header)) + header
    data += bytes(-len(data) % 64)
    with pytest.raises(StateFileError, match="unknown tag 'x'"):
        read_state(io.BytesIO(data))


# ---------------------------------------------------------------------------- issue 21:
# a state file is a safetensors file: other tools open it

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_a_state_file_is_a_safetensors_file_that_lists_every_tensor_by_its_path(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 7,
             "mask": torch.tensor([True, False]), "half": torch.ones(3, dtype=torch.float16),
             "z": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex128)}
    path = tmp_path / "state.cadence"
    write_state(state, path)
    with safe_open(str(path), framework="pt") as opened:
        names = set(opened.keys())
        assert torch.equal(opened.get_tensor("model.0.weight"), model.state_dict()["0.weight"])
        assert torch.equal(opened.get_tensor("optimizer.state.0.exp_avg"),
                           optimizer.state_dict()["state"][0]["exp_avg"])
        assert opened.metadata()["format"] == "pt"
    assert {"model.0.weight", "model.1.running_mean", "mask", "half", "z"} <= names
    plain = load_file(str(path))  # safetensors' own loader: every tensor, by the same names
    assert set(plain) == names and plain["mask"].dtype == torch.bool
    assert torch.equal(torch.view_as_complex(plain["z"]), state["z"])  # complex: real pairs
    loaded = read_state(path)
    assert loaded["step"] == 7 and loaded["z"].dtype == torch.complex128
    assert torch.equal(loaded["z"], state["z"]) and torch.equal(loaded["mask"], state["mask"])


def test_a_snapshot_packed_for_a_background_write_is_a_safetensors_file_too(tmp_path):
    from safetensors.torch import load_file

    from cadence.engine.state_file import HostSnapshot

    state = {"a": torch.arange(5, dtype=torch.int8), "b": torch.randn(3, 2),
             "c": torch.arange(4, dtype=torch.float64), "d": torch.ones(2, dtype=torch.bfloat16)}
    packed = HostSnapshot().pack(state)
    write_state(packed, tmp_path / "packed.cadence")
    plain = load_file(str(tmp_path / "packed.cadence"))
    for name, value in state.items():
        assert torch.equal(plain[name], value), name


def test_a_safetensors_file_that_is_not_cadences_is_refused_in_words(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(StateFileError, match="without cadence's metadata"):
        read_state(tmp_path / "foreign.safetensors")


def test_a_checkpoint_written_in_state_format_1_still_restores(tmp_path):
    """``tests/fixtures/state_format_1``: a checkpoint of a small model and its Adam state,
    written by cadence before state files became safetensors (``CADENCE-STATE`` magic).

    This test is why state format 1 is still read (`cadence.engine.state_file`'s
    ``_read_legacy``): issue 30 keeps a legacy format only where a user's saved checkpoint
    needs it, and this is one. The formats with no such checkpoint went (``TorchSaveIO``'s
    ``state.pt``, ``rank-<r>.pt``, ``rng-<r>.*``)."""
    import shutil

    import cadence

    shutil.copytree(FIXTURES / "state_format_1" / "checkpoints", tmp_path / "checkpoints")
    assert (tmp_path / "checkpoints" / "ckpt-3" / "state.cadence").read_bytes()[:16] == MAGIC
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    manager = cadence.CheckpointManager({"model": model, "optimizer": optimizer},
                                        tmp_path / "checkpoints")
    assert manager.restore_or_initialize() is not None
    expected = torch.load(FIXTURES / "state_format_1" / "expected.pt", weights_only=True)
    for name, value in expected["model"].items():
        assert torch.equal(model.state_dict()[name], value), name
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"],
                       expected["optimizer"]["state"][0]["exp_avg"])
