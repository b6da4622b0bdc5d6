"""Token shards on disk: nanoGPT's train.bin as it is, prepared folders with a manifest, and
every way such files can be wrong -- truncated, forged, linked out of their folder -- refused in
one line before anything is read."""

import json
import os

import numpy as np
import pytest
import torch

from cadence.core.errors import ConfigError
from cadence.data.token_format import (
    MANIFEST,
    begin_token_folder,
    finish_token_folder,
    open_token_files,
    write_shard,
)
from cadence.data.token_shards import TokenShards


def nanogpt_bin(path, count, dtype=np.uint16, seed=0):
    """A token file as nanoGPT's prepare.py writes it: ``np.array(ids, dtype).tofile(path)``."""
    tokens = np.random.default_rng(seed).integers(0, 50257, count).astype(dtype)
    tokens.tofile(path)
    return tokens


def prepared(folder, documents, dtype="uint16", vocab_size=1000, per_file=None):
    """A folder of prepared shards from lists of documents (lists of token ids)."""
    per_file = per_file or [len(documents)]
    partial = begin_token_folder(folder)
    entries, at = [], 0
    for number, count in enumerate(per_file):
        docs = documents[at: at + count]
        at += count
        tokens = np.concatenate([np.asarray(d) for d in docs]).astype(dtype)
        starts = np.cumsum([0] + [len(d) for d in docs[:-1]], dtype=np.int64)
        entries.append(write_shard(partial, f"{number:05d}", tokens, starts))
    return finish_token_folder(partial, folder, entries, dtype,
                               {"kind": "test", "vocab_size": vocab_size})


def test_nanogpts_train_bin_reads_as_it_is_in_windows_of_sequence_length_plus_one(tmp_path):
    tokens = nanogpt_bin(tmp_path / "train.bin", 1001)
    shards = TokenShards.open(str(tmp_path / "train.bin"), sequence_length=100)
    assert len(shards) == 10  # (1001 - 1) // 100
    assert shards.files[0].tokens.dtype == np.uint16 and shards.vocab_size is None
    windows, starts = shards.read(np.array([0, 3, 9]))
    assert starts is None
    for row, sample in enumerate([0, 3, 9]):
        assert windows[row].tolist() == tokens[sample * 100: sample * 100 + 101].tolist()
    inputs, labels = shards[3]  # nanoGPT's x = data[i:i+L], y = data[i+1:i+1+L]
    assert inputs.dtype == torch.int64
    assert inputs.tolist() == tokens[300:400].tolist()
    assert labels.tolist() == tokens[301:401].tolist()


def test_a_glob_and_comma_separated_paths_are_read_in_order_windows_never_cross_files(tmp_path):
    first = nanogpt_bin(tmp_path / "a.bin", 25, seed=1)
    second = nanogpt_bin(tmp_path / "b.bin", 25, seed=2)
    for spec in (str(tmp_path / "*.bin"), f"{tmp_path / 'a.bin'}, {tmp_path / 'b.bin'}"):
        shards = TokenShards.open(spec, sequence_length=10)
        assert len(shards) == 4  # 2 per file: the last 4 tokens of each are in no window
        windows, _ = shards.read(np.arange(4))
        assert windows[1].tolist() == first[10:21].tolist()
        assert windows[2].tolist() == second[0:11].tolist()


def test_a_prepared_folder_reads_through_its_manifest_with_its_dtype_and_documents(tmp_path):
    documents = [list(range(1, 8)), list(range(100_000, 100_005)), [7, 7, 7]]
    folder = prepared(tmp_path / "data", documents, dtype="uint32", vocab_size=200_000,
                      per_file=[2, 1])
    files = open_token_files(str(folder))
    assert [f.path.name for f in files] == ["00000.bin", "00001.bin"]
    assert files[0].tokens.dtype == np.uint32 and files[0].documents.tolist() == [0, 7]
    assert files[0].vocab_size == 200_000
    single = open_token_files(str(folder / "00000.bin"))  # a file, its manifest beside it
    assert single[0].tokens.dtype == np.uint32 and single[0].documents.tolist() == [0, 7]
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["num_documents"] == 3 and manifest["num_tokens"] == 15
    assert manifest["files"][0]["sha256"] and manifest["tokenizer"]["vocab_size"] == 200_000


def test_packed_windows_say_where_each_tokens_document_starts(tmp_path):
    folder = prepared(tmp_path / "data", [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11, 12]])
    shards = TokenShards.open(str(folder), sequence_length=4, packing=True)
    windows, starts = shards.read(np.array([0, 1]), with_documents=True)
    assert windows.tolist() == [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9]]
    assert starts.tolist() == [[0, 0, 0, 3, 3], [0, 0, 0, 0, 0]]  # a document begun before
    features, labels = shards[0]
    assert features["position_ids"].tolist() == [0, 1, 2, 0]
    assert labels.tolist() == [2, 3, -100, 5]  # no target across the boundary


def test_packing_without_a_document_index_is_one_line_naming_the_fix(tmp_path):
    nanogpt_bin(tmp_path / "train.bin", 100)
    with pytest.raises(ConfigError, match="has no document index .* cadence prepare-data"):
        TokenShards.open(str(tmp_path / "train.bin"), 10, packing=True)


@pytest.mark.parametrize(("spec", "says"), [
    ("missing.bin", "does not exist"),
    ("*.tokens", "matches no file"),
    ("folder", "is a folder without a manifest.json"),
])
def test_a_path_that_names_no_token_files_is_one_line(tmp_path, spec, says):
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match=says):
        open_token_files(str(tmp_path / spec))


def test_too_few_tokens_for_one_window_is_one_line(tmp_path):
    nanogpt_bin(tmp_path / "train.bin", 10)
    with pytest.raises(ConfigError, match="not one window of sequence_length"):
        TokenShards.open(str(tmp_path / "train.bin"), 10)


def test_a_token_file_of_an_odd_number_of_bytes_is_one_line(tmp_path):
    (tmp_path / "train.bin").write_bytes(b"\0" * 101)
    with pytest.raises(ConfigError, match="not a whole number of uint16 tokens"):
        open_token_files(str(tmp_path / "train.bin"))


# ---------------------------------------------------------------------------- untrusted folders


def forge(folder, change):
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(("change", "says"), [
    (lambda m: m.update(format="other"), "is not a manifest of prepared token shards"),
    (lambda m: m.update(version=99), "its version is 99"),
    (lambda m: m.update(dtype="float32"), "its dtype 'float32'"),
    (lambda m: m["tokenizer"].update(vocab_size=70_000), "vocab_size"),
    (lambda m: m["files"][0].update(tokens="../outside.bin"), "names no token file in its"),
    (lambda m: m["files"][0].update(tokens="/etc/passwd"), "names no token file in its"),
    (lambda m: m["files"][0].update(documents="../x.npy"), "is not a name in its folder"),
    (lambda m: m["files"][0].update(num_tokens=-1), "has no count 'num_tokens'"),
    (lambda m: m["files"][0].update(num_tokens=True), "has no count 'num_tokens'"),
    (lambda m: m["files"][0].update(num_tokens=12), "holds 20 bytes where its manifest says 12"),
    (lambda m: m["files"][0].update(num_documents=3), "of shape \\(2,\\), its manifest says"),
    (lambda m: m["files"][0].update(tokens="gone.bin"), "does not exist"),
])
def test_a_forged_manifest_is_one_line_and_nothing_outside_the_folder_is_read(
        tmp_path, change, says):
    folder = prepared(tmp_path / "data", [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10]])
    (tmp_path / "outside.bin").write_bytes(b"\1\0" * 10)
    forge(folder, change)
    with pytest.raises(ConfigError, match=says) as raised:
        TokenShards.open(str(folder), 4)
    assert "\n" not in str(raised.value)


def test_a_manifest_that_is_not_json_or_too_large_is_one_line(tmp_path):
    folder = prepared(tmp_path / "data", [[1, 2, 3, 4, 5, 6]])
    (folder / MANIFEST).write_text("{not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        open_token_files(str(folder))


def test_a_token_file_linked_out_of_its_folder_is_refused(tmp_path):
    folder = prepared(tmp_path / "data", [[1, 2, 3, 4, 5, 6]])
    secret = tmp_path / "secret.bin"
    secret.write_bytes((folder / "00000.bin").read_bytes())
    (folder / "00000.bin").unlink()
    os.symlink(secret, folder / "00000.bin")
    with pytest.raises(ConfigError, match="is a symbolic link: cadence does not follow links in a "
                                          "data folder"):
        open_token_files(str(folder))


def test_a_linked_manifest_is_refused(tmp_path):
    folder = prepared(tmp_path / "data", [[1, 2, 3, 4, 5, 6]])
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text((folder / MANIFEST).read_text())
    (folder / MANIFEST).unlink()
    os.symlink(elsewhere, folder / MANIFEST)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        open_token_files(str(folder))


def test_a_truncated_token_file_is_one_line(tmp_path):
    folder = prepared(tmp_path / "data", [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10]])
    path = folder / "00000.bin"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ConfigError, match="is truncated or not the file that was prepared"):
        open_token_files(str(folder))


@pytest.mark.parametrize(("index", "says"), [
    (np.array([0, 4], dtype=np.int32), "holds int32"),
    (np.array([0, 0], dtype=np.int64), "must start at 0, increase, and stay below"),
    (np.array([0, 12], dtype=np.int64), "must start at 0, increase, and stay below"),
    (np.array([3, 4], dtype=np.int64), "must start at 0"),
    (np.array([[0, 4]], dtype=np.int64), "of shape \\(1, 2\\)"),
    (None, "truncated"),
    (b"\x93NUMPY\x01\x00{'descr': 'O'", ".npy header cannot be read"),
    (b"PK\x03\x04 pickle", ".npy header cannot be read"),
])
def test_a_truncated_or_forged_document_index_is_one_line(tmp_path, index, says):
    folder = prepared(tmp_path / "data", [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10]])
    path = folder / "00000.documents.npy"
    if index is None:
        path.write_bytes(path.read_bytes()[:-3])
    elif isinstance(index, bytes):
        path.write_bytes(index)
    else:
        with open(path, "wb") as handle:
            np.lib.format.write_array(handle, index)
    with pytest.raises(ConfigError, match=says) as raised:
        open_token_files(str(folder))
    assert "is not a document index of its token file" in str(raised.value)


def test_a_folder_is_prepared_once_and_a_half_prepared_one_is_not_read(tmp_path):
    folder = tmp_path / "data"
    partial = begin_token_folder(folder)
    write_shard(partial, "00000", np.arange(10, dtype=np.uint16), np.array([0]))
    # the preparation dies here: its files are in a hidden folder, and `folder` does not exist
    assert not folder.exists() and partial.name.startswith(".data.partial-")
    with pytest.raises(ConfigError, match="does not exist"):
        open_token_files(str(folder))
    prepared(folder, [[1, 2, 3]])
    with pytest.raises(ConfigError, match="exists already"):
        begin_token_folder(folder)
