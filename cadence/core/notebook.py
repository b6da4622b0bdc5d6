"""Running inside a Jupyter notebook: how to tell, and the loop lines a notebook shows.

A notebook's kernel has no terminal (so a progress bar keyed on ``stderr.isatty()`` never
shows) and, unless the user configured logging, no handler on any logger (so the INFO loop lines
go nowhere). `in_notebook` tells the progress bar and the preemption handling where they run;
`show_log_lines` gives the ``cadence`` logger a handler of its own there -- one that writes only
while no other handler would, so a user who configures logging (now or later, on the root
logger or on ``cadence``) never sees a line twice.
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
    """Writes ``cadence``'s records to the current ``sys.stderr`` (the kernel's, which it
    replaces per cell) while no other handler on the record's way up the logger tree would."""

    def __init__(self) -> None:
        super().__init__()
        self.setLevel(logging.INFO)
        self.setFormatter(logging.Formatter("%(message)s"))

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
    """In a notebook whose ``cadence`` logger shows nothing at INFO -- no handler of the user's
    and no level set -- adds a handler that shows cadence's lines (once; idempotent)."""
    if not in_notebook():
        return
    logger = logging.getLogger("cadence")
    if any(isinstance(handler, _FallbackHandler) for handler in logger.handlers):
        return
    if logger.hasHandlers() or logger.level != logging.NOTSET:
        return  # the user configured logging: theirs decides
    logger.setLevel(logging.INFO)
    logger.addHandler(_FallbackHandler())
