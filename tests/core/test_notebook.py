"""In a notebook: cadence's own log handler only where the user has none, the progress bar, and
Ctrl-C as `KeyboardInterrupt` after the checkpoint (tests/test_jupyter.py runs a real kernel)."""

import io
import logging
import re
import signal
import sys

import pytest

import cadence.callbacks.progress as progress
import cadence.core.notebook as notebook
import cadence.core.preemption as preemption
from cadence.core.errors import Preempted
from cadence.core.notebook import in_notebook, show_log_lines
from cadence.core.preemption import Preemption


@pytest.fixture
def kernel(monkeypatch):
    """A notebook kernel without any logging setup; cadence's logger is put back as it was
    afterwards. (Each test sets pytest's own root handlers and stderr aside: `bare_root`.)"""
    logger = logging.getLogger("cadence")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.setattr(notebook, "in_notebook", lambda: True)
    logging.Logger.manager._clear_cache()
    yield
    logging.Logger.manager._clear_cache()


def bare_root(monkeypatch) -> io.StringIO:
    """Sets aside the handlers pytest puts on the root logger, and the stderr it captures, for
    each test phase; returns the kernel's stderr."""
    monkeypatch.setattr(logging.root, "handlers", [])
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    return stderr


def test_a_script_without_logging_setup_shows_the_lines_as_the_command_line(monkeypatch):
    """Outside a kernel (a plain script calling run_experiment, a Controller, a TrainLoop),
    with no handler anywhere: cadence's lines show on stderr with the time, as the ``cadence``
    command shows them (issue 42: the Python front-ends printed nothing)."""
    logger = logging.getLogger("cadence")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    stderr = bare_root(monkeypatch)
    assert not in_notebook()
    show_log_lines()
    logging.getLogger("cadence.loop").info("train | step: 10")
    assert re.fullmatch(r"\d\d:\d\d:\d\d  train \| step: 10\n", stderr.getvalue())


def test_with_a_handler_of_the_users_nothing_is_added():
    before = list(logging.getLogger("cadence").handlers)
    assert logging.root.handlers  # pytest's: a configuration of the user's
    show_log_lines()
    assert logging.getLogger("cadence").handlers == before


def test_in_a_kernel_without_logging_setup_the_loop_lines_show_once(kernel, monkeypatch):
    stderr = bare_root(monkeypatch)
    show_log_lines()
    show_log_lines()  # idempotent
    logging.getLogger("cadence.loop").info("train | step: 10")
    assert stderr.getvalue() == "train | step: 10\n"


def test_a_handler_the_user_adds_later_takes_over_without_double_lines(kernel, monkeypatch):
    stderr = bare_root(monkeypatch)
    show_log_lines()
    theirs = io.StringIO()
    logging.root.addHandler(logging.StreamHandler(theirs))
    logging.getLogger("cadence.loop").info("train | step: 20")
    assert stderr.getvalue() == "" and theirs.getvalue() == "train | step: 20\n"


@pytest.mark.parametrize("configured", ["root", "cadence", "level"])
def test_a_user_who_configured_logging_gets_no_handler_of_cadence(kernel, monkeypatch,
                                                                  configured):
    bare_root(monkeypatch)
    if configured == "root":
        logging.root.addHandler(logging.NullHandler())
    elif configured == "cadence":
        logging.getLogger("cadence").addHandler(logging.NullHandler())
    else:
        logging.getLogger("cadence").setLevel(logging.WARNING)
    show_log_lines()
    assert not any(isinstance(h, notebook._FallbackHandler)
                   for h in logging.getLogger("cadence").handlers)


def test_ctrl_c_in_a_notebook_is_a_keyboard_interrupt_after_the_checkpoint(monkeypatch):
    monkeypatch.setattr(preemption, "in_notebook", lambda: True)
    saved = []
    stop = Preemption()
    stop.received = signal.SIGINT
    with pytest.raises(KeyboardInterrupt, match=r"saved ckpt-7\); run the cell again"):
        stop.finish(lambda: saved.append(1) or "ckpt-7")
    assert saved == [1]
    stop.received = signal.SIGTERM  # a kernel being shut down: the scheduler's exit code
    with pytest.raises(Preempted):
        stop.finish(lambda: "ckpt-7")


def test_ctrl_c_outside_a_notebook_is_still_preempted():
    stop = Preemption()
    stop.received = signal.SIGINT
    with pytest.raises(Preempted) as raised:
        stop.finish(lambda: "ckpt-7")
    assert raised.value.code == 130 and raised.value.checkpoint == "ckpt-7"


def test_the_progress_bar_shows_in_a_notebook(monkeypatch):
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    assert not progress.ProgressBar()._active()
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    assert progress.ProgressBar()._active()
    assert not progress.ProgressBar(enabled=False)._active()
