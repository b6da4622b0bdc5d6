"""`ETA`: the time left, from how fast progress was made -- one estimator for every front-end.

Progress is counted in any unit: steps, epochs, or the fraction of training done. Two ways to
turn it into a rate, for the two ways a run is watched:

* ``window=None`` (`TrainLoop`'s log lines, as tfsnippet): the average rate since the first
  sample, i.e. since the loop started or resumed;
* ``window=k`` (`EstimatedTimeLeft`, as tensorpack): the median rate of the last k spans
  recorded with `record` -- robust to one slow span (an evaluation, a checkpoint write) -- or,
  with ``median=False``, their mean.

>>> eta = ETA()
>>> eta.start(0.0, now=100.0)
>>> eta.estimate(0.25, total=1.0, now=110.0)   # a quarter done in 10 s: 30 s to go
30.0
>>> windowed = ETA(window=2)
>>> for span, seconds in ((10, 5.0), (10, 50.0), (10, 6.0)):   # one slow span
...     windowed.start(0, now=0.0)
...     windowed.record(span, now=seconds)
>>> windowed.estimate(0, total=100, now=0.0)   # median of the last two: 2.8 s per unit
280.0
"""

from __future__ import annotations

import statistics
from collections import deque

from cadence.core.intervals import check_int


class ETA:
    """Estimates the seconds left from samples of ``(done, time)``.

    Args:
        window: None: the average rate since the first sample; k: the median rate of the last k
            spans recorded with `record`.
        median: with a `window`, the median of its spans' rates; False: their mean.
    """

    def __init__(self, window: int | None = None, median: bool = True) -> None:
        self.window = check_int("ETA", "window", window,
                                "Pass e.g. window=20, or None to average over the whole run.",
                                none_ok=True)
        self.median = median
        self._first: tuple[float, float] | None = None
        self._span_start: tuple[float, float] | None = None
        self._spans: deque[float] = deque(maxlen=window or 1)

    @property
    def started(self) -> bool:
        """Whether a first sample was taken."""
        return self._first is not None

    def start(self, done: float, now: float) -> None:
        """Marks where the next span starts (the first call is also the baseline of the
        average rate)."""
        if self._first is None:
            self._first = (done, now)
        self._span_start = (done, now)

    def record(self, done: float, now: float) -> None:
        """Records the span from the last `start` (or `record`) to here; the next one starts
        here. A span without progress is not recorded."""
        if self._span_start is not None:
            done0, time0 = self._span_start
            if done > done0:
                self._spans.append((now - time0) / (done - done0))
        self.start(done, now)

    def estimate(self, done: float, total: float, now: float) -> float | None:
        """Seconds until `total` is done, or None when no rate is known yet."""
        if self.window is not None:
            if not self._spans:
                return None
            per_unit = (statistics.median(self._spans) if self.median
                        else statistics.fmean(self._spans))
        else:
            if self._first is None or done - self._first[0] < 1e-7:
                return None
            per_unit = (now - self._first[1]) / (done - self._first[0])
        return max(total - done, 0.0) * per_unit
