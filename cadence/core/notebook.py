"""Running inside a Jupyter notebook: how to tell; and cadence's log lines where nothing would
show them -- a notebook, or a Python script without any logging setup.

A notebook's kernel has no terminal (so a progress bar keyed on ``stderr.isatty()`` never
shows) and, unless the user configured logging, no handler on any logger (so the INFO loop lines
go nowhere); the same holds for a plain Python script that calls ``run_experiment``, a
`Controller`, a `TrainLoop` or a tensorpack trainer. `in_notebook` tells the progress bar and the
preemption handling where they run; `show_log_lines` gives the ``cadence`` logger a handler of
its own -- as the ``cadence`` command shows them: the time and the message, on stderr (the
message alone in a notebook) -- one that writes only while no other handler would, so a user who
configures logging (now or later, on the root logger or on ``cadence``) never sees a line twice.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO


def in_notebook() -> bool:
    """Whether this process is an IPython kernel (Jupyter, VS Code, Colab), not a terminal
    IPython or plain Python. IPython is never imported here: a kernel has imported it."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if callable(get_ipython) else None
    return getattr(shell, "kernel", None) is not None


class _FallbackHandler(logging.StreamHandler):
    """Writes ``cadence``'s records to the current ``sys.stderr`` (a kernel's, which it
    replaces per cell) while no other handler on the record's way up the logger tree would."""

    def __init__(self, notebook: bool) -> None:
        super().__init__()
        self.setLevel(logging.INFO)
        self.setFormatter(logging.Formatter("%(message)s") if notebook else logging.Formatter(
            "%(asctime)s  %(message)s", datefmt="%H:%M:%S"))  # the cadence command's lines

    @property
    def stream(self) -> TextIO:  # StreamHandler's attribute, read at every emit
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass  # StreamHandler.__init__ sets it; the current sys.stderr is always used

    def filter(self, record: logging.LogRecord) -> bool:
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return False  # the user's handler shows it
            logger = logger.parent if logger.propagate else None
        return super().filter(record) is not False


def show_log_lines() -> None:
    """Where the ``cadence`` logger shows nothing at INFO -- no handler of the user's on it or
    the root logger, and no level set -- adds a handler that shows cadence's lines (once;
    idempotent). Every front-end calls it as it starts: the Python ones log to the terminal
    as the command line does, and a user's own logging configuration wins."""
    logger = logging.getLogger("cadence")
    if any(isinstance(handler, _FallbackHandler) for handler in logger.handlers):
        return
    if logger.hasHandlers() or logger.level != logging.NOTSET:
        return  # the user configured logging: theirs decides
    logger.setLevel(logging.INFO)
    logger.addHandler(_FallbackHandler(in_notebook()))
