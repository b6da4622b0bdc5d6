"""The default experiment's data: scikit-learn's bundled digits, read without importing
``sklearn.datasets`` (about a second of SciPy and scikit-learn imports in every rank)."""

import sys

import numpy as np
import pytest
import torch

from cadence.task.experiments import digits

pytest.importorskip("sklearn")


def sklearns_digits():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target


def test_the_images_and_labels_are_sklearns_own_read_without_importing_sklearn_datasets(
        monkeypatch):
    pixels, target = sklearns_digits()
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # importing it now fails
    images, labels = digits.load_digits_arrays()
    assert images.shape == (1797, 64) and images.dtype == torch.float32
    assert labels.dtype == torch.int64
    assert torch.equal(images, torch.as_tensor(pixels, dtype=torch.float32) / 16.0)
    assert torch.equal(labels, torch.as_tensor(target))
    assert float(images.min()) == 0.0 and float(images.max()) == 1.0
    assert sorted(np.unique(labels.numpy())) == list(range(10))


def test_where_scikit_learn_keeps_the_file_elsewhere_load_digits_reads_it(monkeypatch):
    monkeypatch.setattr(digits, "_bundled_digits_file", lambda: None)
    images, labels = digits.load_digits_arrays()
    pixels, target = sklearns_digits()
    assert torch.equal(images, torch.as_tensor(pixels, dtype=torch.float32) / 16.0)
    assert torch.equal(labels, torch.as_tensor(target))


def test_a_file_that_is_not_the_table_load_digits_reads_is_left_to_load_digits(
        tmp_path, monkeypatch):
    import gzip

    other = tmp_path / "digits.csv.gz"
    with gzip.open(other, "wt") as handle:
        handle.write("1,2,3\n4,5,6\n")  # another layout: not 64 pixels and a label a row
    monkeypatch.setattr(digits, "_bundled_digits_file", lambda: other)
    images, labels = digits.load_digits_arrays()
    pixels, target = sklearns_digits()
    assert torch.equal(images, torch.as_tensor(pixels, dtype=torch.float32) / 16.0)
    assert torch.equal(labels, torch.as_tensor(target))


def test_without_scikit_learn_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setattr(digits, "_bundled_digits_file", lambda: None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"pip install 'cadence\[experiments\]'"):
        digits.load_digits_arrays()
