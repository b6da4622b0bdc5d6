"""The ``gpt`` experiment's data: the standard library's bytes prepared once into token shards in
the cache (each file a document), and a user's token files checked in the config before
anything runs."""

import numpy as np
import pytest

import cadence
from cadence.data.token_format import open_token_files
from cadence.task.experiments.char_lm import stdlib_files
from cadence.task.experiments.gpt import GPTTask, cache_dir, stdlib_token_folders


def test_the_cache_folder_is_cadences_own_then_xdgs_then_the_homes(monkeypatch, tmp_path):
    monkeypatch.setenv("CADENCE_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("CADENCE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "cadence"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "cadence"


def test_the_stdlib_is_prepared_once_each_file_a_document(monkeypatch, tmp_path):
    monkeypatch.setenv("CADENCE_CACHE_DIR", str(tmp_path))
    folders = stdlib_token_folders(60_000, 0.25)
    written = {split: (folder / "manifest.json").stat().st_ino
               for split, folder in folders.items()}
    assert stdlib_token_folders(60_000, 0.25) == folders  # read from the cache: not written
    assert {split: (folder / "manifest.json").stat().st_ino
            for split, folder in folders.items()} == written
    files = stdlib_files(60_000)
    train, validation = (open_token_files(str(folders[s]))[0] for s in ("train", "validation"))
    text = np.frombuffer(b"".join(files), dtype=np.uint8)
    assert np.array_equal(np.concatenate([train.tokens, validation.tokens]), text)
    assert train.tokens.size == 45_000 and train.vocab_size == 256
    starts = np.cumsum([0] + [len(f) for f in files[:-1]])
    assert train.documents.tolist() == starts[starts < 45_000].tolist()
    assert validation.documents[0] == 0


def test_training_on_a_users_tokens_needs_their_validation_tokens_where_it_evaluates():
    config = cadence.load_config("gpt", overrides=["task.train_data.input_path=train.bin"])
    config.validate()  # --mode train needs no validation data
    with pytest.raises(cadence.ConfigError, match="task.validation_data.input_path is empty "
                                                  "while task.train_data.input_path is set"):
        GPTTask(config.task).build_inputs(config.task.validation_data)


@pytest.mark.parametrize(("overrides", "says"), [
    (["task.train_data.input_path=a.bin,b.bin", "task.validation_data.input_path=v.bin",
      "task.train_data.input_weights=[1]"], "must give one weight per comma-separated entry"),
    (["task.validation_data.input_weights=[1]"], "task.validation_data.input_weights must be "
                                                 "empty"),
])
def test_token_paths_that_do_not_fit_are_config_errors_before_anything_runs(overrides, says):
    with pytest.raises(cadence.ConfigError, match=says):
        cadence.load_config("gpt", overrides=overrides).validate()
