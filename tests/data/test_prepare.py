"""``cadence prepare-data``: text files tokenized into token shards with a tokenizer given by
path (one trained here, from a small text: nothing downloaded) or bytes, in parallel, the folder
whole or absent -- a preparation killed half way leaves nothing that is read as prepared."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from cadence.core.errors import ConfigError
from cadence.data.prepare import prepare_data
from cadence.data.token_format import MANIFEST, open_token_files
from cadence.task.cli import main

TEXT = ["the cat sat on the mat", "a dog ate the bone", "the mat was red and the cat was not"]


@pytest.fixture
def tokenizer_file(tmp_path):
    """A BPE tokenizer trained on the fly from a small text, saved as tokenizer.json."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"])
    tokenizer.train_from_iterator(TEXT * 10, trainer)
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path, tokenizer


def inputs(tmp_path):
    (tmp_path / "one.txt").write_text(TEXT[0])
    (tmp_path / "two.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXT[1:]))
    return [str(tmp_path / "one.txt"), str(tmp_path / "*.jsonl")]


def test_a_tokenizer_json_prepares_each_file_with_its_documents_in_parallel(
        tmp_path, tokenizer_file):
    path, tokenizer = tokenizer_file
    seen = []
    prepared = prepare_data(inputs(tmp_path), tmp_path / "out", str(path), workers=2,
                            progress=seen.append)
    assert seen == ["one.txt", "two.jsonl"]
    files = open_token_files(str(tmp_path / "out"))
    expected = [tokenizer.encode(text).ids for text in TEXT]
    assert files[0].tokens.tolist() == expected[0]
    assert files[1].tokens.tolist() == expected[1] + expected[2]
    assert files[1].documents.tolist() == [0, len(expected[1])]
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["dtype"] == "uint16" and manifest["num_documents"] == 3
    assert manifest["tokenizer"]["kind"] == "tokenizers"
    assert manifest["tokenizer"]["vocab_size"] == tokenizer.get_vocab_size()
    assert prepared.num_tokens == sum(map(len, expected))


def test_a_transformers_tokenizer_folder_is_read_locally(tmp_path, tokenizer_file):
    transformers = pytest.importorskip("transformers")
    path, tokenizer = tokenizer_file
    folder = tmp_path / "tok"
    transformers.PreTrainedTokenizerFast(tokenizer_file=str(path)).save_pretrained(folder)
    prepare_data(inputs(tmp_path), tmp_path / "out", str(folder))
    files = open_token_files(str(tmp_path / "out"))
    assert files[0].tokens.tolist() == tokenizer.encode(TEXT[0]).ids
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["tokenizer"]["kind"] == "transformers"


def test_the_command_prepares_bytes_and_says_how_to_train_from_them(tmp_path, capsys):
    assert main(["prepare-data", *inputs(tmp_path), "--out", str(tmp_path / "out"),
                 "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert f"Train from it with --set task.train_data.input_path={tmp_path / 'out'}" in out
    files = open_token_files(str(tmp_path / "out"))
    assert bytes(files[0].tokens.astype(np.uint8)) == TEXT[0].encode()


@pytest.mark.parametrize(("arguments", "says"), [
    (["nothing*.txt"], "names no file"),
    (["one.txt", "--tokenizer", "missing.json"], "--tokenizer .*missing.json' does not exist"),
    (["one.txt", "--tokenizer", "one.txt"], "cannot be read as a tokenizers tokenizer"),
    (["one.txt", "--workers", "0"], "--workers \\(got 0\\) must be at least 1"),
    (["bad.jsonl"], "line 1 has no string field 'text': set --text-key"),
    (["one.txt", "--out", "exists"], "exists already"),
])
def test_a_mistake_is_one_line_and_exit_2_before_anything_is_written(
        tmp_path, capsys, monkeypatch, arguments, says):
    monkeypatch.chdir(tmp_path)
    inputs(tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    (tmp_path / "exists").mkdir()
    if "--out" not in arguments:
        arguments = [*arguments, "--out", "out"]
    assert main(["prepare-data", *arguments]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cadence: error: ") and "\n" not in err
    assert re.search(says, err), err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_preparation_killed_half_way_leaves_nothing_read_as_prepared(tmp_path):
    """SIGKILL once the first files are written: the folder does not exist (its files are in a
    hidden partial folder), so training from it is refused; the same command again prepares
    it whole, and removes what the dead one left."""
    for number in range(40):
        (tmp_path / f"{number:02d}.txt").write_text("token shards " * 20_000)
    command = [sys.executable, "-m", "cadence", "prepare-data", str(tmp_path / "*.txt"),
               "--out", str(tmp_path / "out"), "-j", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    partial = []
    while time.monotonic() < deadline and not any(
            len(list(p.glob("*.bin"))) >= 3 for p in partial):
        partial = list(tmp_path.glob(".out.partial-*"))
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert partial and not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="does not exist"):
        open_token_files(str(tmp_path / "out"))
    subprocess.run(command, check=True, capture_output=True)
    assert len(open_token_files(str(tmp_path / "out"))) == 40
    assert not list(tmp_path.glob(".out.partial-*"))
