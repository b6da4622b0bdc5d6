"""Goodput: how much of a run's wall time trained steps that survived, and where the rest went.

`GoodputCalculator` takes a run's timeline events (`cadence.records.timeline`) one at a time, in
the order they were written, and gives a `GoodputReport` at any moment: after a whole run
(`run_goodput`, ``cadence goodput RUN``) or at each loop's end of a live one (the same code, fed
by the `Timeline` writer's listener). Each event costs O(1) (a rollback: O(loops undone)); a
report costs O(attempts), plus a sort of the loops for the ideal-step-time view.

**The rules.** Time is swept once, in the order of the events: a cursor marks how far the time
is accounted, and each event gives the time from the cursor to its ``t`` to exactly one bucket,
so the buckets are disjoint by construction and add up to the wall time (a ``t`` before the
cursor -- a clock stepped back, a host whose clock is behind -- accounts nothing, never a
negative time):

- **Attempts** begin at each ``start``. An attempt begins when its process was created
  (``process_start_t``, when known and no earlier than the previous attempt's last event), else
  at its ``start``. It ended with its ``end``'s outcome (finished, preempted, error), else
  ``crashed``, or ``running`` when it is the last one and the run is live (its ``train.lock``
  is held by its process: `cadence.core.run_dir.RunLock.holder`). Events of another process
  than the current attempt's, and events before the first ``start``, are not counted (they are
  added to ``skipped_lines``).
- **wall** = from the first attempt's beginning to the last event; for a live run, to now.
- **between_attempts** = from an attempt's last event to the next attempt's beginning (the run
  was down: for a requeued Slurm job, the time it waited in the queue; each attempt's share is
  its ``waited_s``, and its Slurm job and restart count are on its report); for a live run
  whose lock is held by a process that has not recorded its ``start`` yet, also from the last
  event to now.
- **restore** = ``restore_begin`` to ``restore_end``; **evaluation** = ``eval_begin`` to
  ``eval_end`` (an unclosed one runs to the attempt's next event that closes nothing: its end);
  **checkpoint** = each save's stall ``[t - stall_s, t]`` plus the loops' ``checkpoint_wait_s``.
- **A loop** covers ``[t - seconds, t]`` (not before the previous loop's end or the attempt's
  beginning). Within it, ``data_wait_s`` is **data_wait**, ``checkpoint_wait_s`` is
  **checkpoint**, and the rest is its compute, **productive** while its steps survive. Time
  already given to startup or other inside the loop's span (an instant event such as a
  background ``commit`` in the middle of the loop moved the cursor) is taken back by the loop.
- **lost_progress**: a ``restore_end`` at step r rolls back every step above r recorded
  before it: a whole loop's compute moves from productive to lost progress, a loop that
  straddles r the share of its compute above r (``(last - r) / steps``). A restore of nothing
  after earlier loops (``step`` 0) loses them all. A loop that begins below the last surviving
  step without a restore recorded is taken as a rollback to its first step (as
  ``ml-goodput-measurement`` reads a repeated step). The data and checkpoint waits of a lost
  loop stay in their buckets, for two reasons: the waits happened whatever became of the
  steps, and a rollback then moves time only from productive to lost progress, so that the
  live figures of earlier loops never change in any other bucket.
- **startup** = the time of an attempt before its first loop began that is none of the above;
  **other** = the rest of the wall time (between loops: logging, summaries, callbacks; after
  the last loop: closing down; for a live attempt, the loop in progress). ``other`` is computed
  as the wall time minus everything else, and is never negative, since the buckets are
  disjoint.
- A loop of 0 steps (the data ended) made no progress: its compute is other.
- **goodput** = productive / wall (None for a wall time of 0).
- **The ideal-step-time view**: the ideal step time is the median of the surviving loops'
  compute per step, weighted by their steps; **slowdown** = the surviving loops' compute over
  that pace (each loop's excess, never a negative one); **ideal goodput** = (productive -
  slowdown) / wall. Slowdown is a part of productive time, not a cause of badput: the steps
  were trained, slowly (``ml-goodput-measurement``'s step-time deviation; the example of
  failures.md 3.3 counts it as a loss).

**Ranks.** Rank 0's waits are in the run's record and the buckets; `run_goodput` also sums each
rank's own ``data_wait_s`` (``rank-<r>.jsonl``) in ``ranks``, whose largest is the input wait of
the slowest rank (in synchronous training it stalls every rank; rank 0 counts that stall as
compute).

**Replica groups** (the fault-tolerant mode, `cadence.engine.fault_tolerance`). Each group's
record (``run-replica-<g>.jsonl``) is its own run, reported on its own in ``replicas`` (with its
ranks' waits, ``replica-<g>-rank-<r>.jsonl``). The job's figures are in group-seconds
(`capacity_report`): capacity = groups x the job's wall time, productive = the sum of the
groups' productive time, and a group's absence -- its ``between_attempts``, and the time before
its first attempt or after its last while others trained -- is lost capacity, not stopped time.
Within a group's loop, its wait for the groups to agree after one died (``stall_s``: the
detection) is other time, and the compute of a step no group committed (``discarded_s``) lost
progress. Each attempt names its group; the job's ideal step time is that of every group's
surviving loops.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadence.core.errors import ConfigError
from cadence.core.run_dir import RunDirectory, RunLock
from cadence.records.timeline import RUN_FILE, TIMELINE_DIR, Event, RunTimeline, read_timeline

BADPUT_CAUSES = ("startup", "restore", "checkpoint", "evaluation", "data_wait", "lost_progress",
                 "between_attempts", "other")
"""The causes of badput, in the order reports list them."""
ENDINGS = ("finished", "preempted", "error", "crashed", "running")
"""How an attempt ended."""
LIVE = ("attempt", "starting")
"""A live run: its last attempt is running, or a new one is starting (not recorded yet)."""


@dataclass
class AttemptReport:
    """One attempt of a run: a process (under torchrun, a round of processes) from its
    ``start`` to its last event.

    Attributes:
        attempt: the id its process recorded.
        start_t: when it began (the process's creation when known, else its ``start``).
        end_t: its last event (now, for a running attempt).
        world_size: its processes.
        restart: torchrun's restart count.
        host: where rank 0 ran.
        first_step: the global step it began from (its restore, else its first loop's first
            step), or None when it reached neither.
        last_step: its global step at its last event (None as for `first_step`).
        end: how it ended, one of `ENDINGS`.
        error: the error an ``end`` of outcome ``"error"`` named.
        signal: the stop signal it received, if any.
        lost_steps: its steps that a later restore rolled back.
        lost_s: their compute time.
        committed_step: its newest durable checkpoint's step, if it committed one.
        setup_s: from its beginning to ``setup_end``, if recorded.
        waited_s: the time the run was down before it began (its share of
            ``between_attempts``): for a requeued Slurm job, its wait in the queue.
        slurm_job: the Slurm job it ran in (``SLURM_JOB_ID``), or None outside Slurm.
        slurm_step: its step there (``"batch"`` for the batch script).
        slurm_restart: ``SLURM_RESTART_COUNT``: how many times the job had been requeued.
        replica: the replica group it belongs to (the fault-tolerant mode), else None.
    """

    attempt: str
    start_t: float
    end_t: float
    world_size: int
    restart: int = 0
    host: str | None = None
    first_step: int | None = None
    last_step: int | None = None
    end: str = "crashed"
    error: str | None = None
    signal: str | None = None
    lost_steps: int = 0
    lost_s: float = 0.0
    committed_step: int | None = None
    setup_s: float | None = None
    waited_s: float = 0.0
    slurm_job: str | None = None
    slurm_step: str | None = None
    slurm_restart: int | None = None
    replica: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The attempt as a JSON object."""
        return dict(self.__dict__)


@dataclass
class GoodputReport:
    """Where a run's wall time went (see the module docstring for the rules).

    Attributes:
        wall_s: from the first attempt's beginning to the last event (or now, when live).
        productive_s: compute time of the steps that survived.
        goodput: ``productive_s / wall_s``; None for a wall time of 0.
        badput_s: seconds by cause, each of `BADPUT_CAUSES`; with `productive_s` they add up to
            `wall_s`.
        attempts: each attempt, in order.
        steps: the steps that survived (the run's net progress).
        live: whether a process trains in the run now.
        skipped_lines: timeline lines not counted (not events of the schema, or of a process
            that was not the current attempt's).
        ideal_step_s: the ideal step time (the weighted median of the surviving loops' step
            times), or None without loops.
        slowdown_s: the surviving loops' compute beyond the ideal step time.
        ideal_goodput: ``(productive_s - slowdown_s) / wall_s``, or None.
        ranks: for a run with rank files, each rank's total waits: ``{"rank", "loops",
            "data_wait_s", "checkpoint_wait_s"}``, by rank.
        replicas: the report of each replica group's record, in the fault-tolerant mode.
        replica: the replica group this report is of, or None.
    """

    wall_s: float
    productive_s: float
    goodput: float | None
    badput_s: dict[str, float]
    attempts: list[AttemptReport]
    steps: int = 0
    live: bool = False
    skipped_lines: int = 0
    ideal_step_s: float | None = None
    slowdown_s: float = 0.0
    ideal_goodput: float | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)
    replicas: list[GoodputReport] = field(default_factory=list)
    replica: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON object: the attributes, attempts and replicas as objects."""
        return {"wall_s": self.wall_s, "productive_s": self.productive_s,
                "goodput": self.goodput, "badput_s": dict(self.badput_s),
                "attempts": [a.to_json() for a in self.attempts], "steps": self.steps,
                "live": self.live, "skipped_lines": self.skipped_lines,
                "ideal_step_s": self.ideal_step_s, "slowdown_s": self.slowdown_s,
                "ideal_goodput": self.ideal_goodput, "ranks": [dict(r) for r in self.ranks],
                "replicas": [r.to_json() for r in self.replicas], "replica": self.replica}

    @property
    def worst_data_wait(self) -> dict[str, Any] | None:
        """The rank that waited longest for input (of `ranks`), or None without rank files."""
        return max(self.ranks, key=lambda r: (r["data_wait_s"], -r["rank"]), default=None)


class _Attempt:
    """What the calculator keeps of one attempt."""

    def __init__(self, event: Event, begin: float) -> None:
        fields = event.fields
        self.id = event.attempt
        self.begin = begin
        self.report = AttemptReport(event.attempt, begin, begin, fields["world_size"],
                                    restart=fields.get("restart", 0), host=fields.get("host"),
                                    slurm_job=fields.get("slurm_job"),
                                    slurm_step=fields.get("slurm_step"),
                                    slurm_restart=fields.get("slurm_restart"),
                                    replica=fields.get("replica"))
        self.loops = 0
        self.loop_floor = begin  # a loop begins no earlier than this: the previous loop's end
        self.restore_open = False
        self.eval_open = False
        self.pending = 0.0  # startup or other time since the last loop, which a loop may take
        self.ended = False


@dataclass(slots=True)
class _Loop:
    """A loop whose steps survive so far."""

    first: int
    last: int
    compute: float
    attempt: int


class GoodputCalculator:
    """Goodput and badput by cause from a run's timeline, incrementally (see the module
    docstring for the rules).

    Feed it every event of the run's record in the order written (`add`, or `add_all`); ask
    for a `report` at any time.

    >>> from cadence.records.timeline import Event
    >>> calc = GoodputCalculator()
    >>> calc.add(Event(100.0, "start", "7-a", {"world_size": 1}))
    >>> calc.add(Event(110.0, "loop_end", "7-a", {"step": 10, "steps": 10, "seconds": 8.0,
    ...                                           "data_wait_s": 1.0, "checkpoint_wait_s": 0.0}))
    >>> calc.add(Event(112.0, "end", "7-a", {"outcome": "finished", "step": 10}))
    >>> report = calc.report()
    >>> report.wall_s, report.productive_s, report.badput_s["startup"], report.badput_s["other"]
    (12.0, 7.0, 2.0, 2.0)
    """

    def __init__(self) -> None:
        self._attempts: list[_Attempt] = []
        self._seen: set[str] = set()
        self._begin: float | None = None
        self._cursor = 0.0
        self._buckets = dict.fromkeys(BADPUT_CAUSES, 0.0)
        self._productive = 0.0
        self._steps = 0  # the surviving loops' steps
        self._loops: list[_Loop] = []
        self.ignored = 0
        """Events not counted: before the first ``start``, or of another attempt's process."""

    # ------------------------------------------------------------------ feeding

    def add_all(self, events: Iterable[Event]) -> None:
        """`add` of each event, in order."""
        for event in events:
            self.add(event)

    def add(self, event: Event) -> None:
        """Accounts the time up to `event` and applies it (see the module docstring)."""
        if event.event == "start":
            self._start(event)
            return
        if not self._attempts or event.attempt != self._attempts[-1].id:
            self.ignored += 1
            return
        attempt = self._attempts[-1]
        handler = getattr(self, f"_on_{event.event}", None)
        if event.event in ("loop_end", "save"):
            handler(attempt, event)  # type: ignore[misc]
        else:
            self._accrue(attempt, self._advance(event.t))
            if handler is not None:
                handler(attempt, event)
        attempt.report.end_t = self._cursor

    def _advance(self, t: float) -> float:
        """The time from the cursor to `t` not yet accounted (0 for a `t` before it); moves
        the cursor there."""
        elapsed = max(0.0, t - self._cursor)
        self._cursor = max(self._cursor, t)
        return elapsed

    @staticmethod
    def _state(attempt: _Attempt) -> str:
        """The bucket of time that passes in `attempt` outside loops and stalls."""
        if attempt.restore_open:
            return "restore"
        if attempt.eval_open:
            return "evaluation"
        return "startup" if attempt.loops == 0 else "other"

    def _accrue(self, attempt: _Attempt, seconds: float) -> None:
        bucket = self._state(attempt)
        self._buckets[bucket] += seconds
        if bucket in ("startup", "other"):
            attempt.pending += seconds

    def _start(self, event: Event) -> None:
        begin = event.t
        started = event.fields.get("process_start_t")
        # A process that trains the run again (a notebook) began this attempt at its start.
        if started is not None and event.attempt not in self._seen:
            begin = min(started, event.t)
        waited = 0.0
        if self._begin is None:
            self._begin = self._cursor = begin
        else:
            begin = max(begin, self._cursor)
            waited = begin - self._cursor
            self._buckets["between_attempts"] += waited
            self._cursor = begin
        self._seen.add(event.attempt)
        attempt = _Attempt(event, begin)
        attempt.report.waited_s = waited
        self._attempts.append(attempt)
        self._accrue(attempt, self._advance(event.t))
        attempt.report.end_t = self._cursor

    # ------------------------------------------------------------------ events

    def _on_setup_end(self, attempt: _Attempt, event: Event) -> None:
        if attempt.report.setup_s is None:
            attempt.report.setup_s = max(0.0, event.t - attempt.begin)

    def _on_restore_begin(self, attempt: _Attempt, event: Event) -> None:
        attempt.restore_open = True

    def _on_restore_end(self, attempt: _Attempt, event: Event) -> None:
        attempt.restore_open = False
        step = event["step"]
        self._roll_back(step)
        if attempt.report.first_step is None:
            attempt.report.first_step = step
        attempt.report.last_step = step

    def _on_eval_begin(self, attempt: _Attempt, event: Event) -> None:
        attempt.eval_open = True

    def _on_eval_end(self, attempt: _Attempt, event: Event) -> None:
        attempt.eval_open = False

    def _on_commit(self, attempt: _Attempt, event: Event) -> None:
        committed = attempt.report.committed_step
        attempt.report.committed_step = max(event["step"], committed or 0)

    def _on_signal(self, attempt: _Attempt, event: Event) -> None:
        attempt.report.signal = event["signal"]

    def _on_end(self, attempt: _Attempt, event: Event) -> None:
        attempt.ended = True
        attempt.report.end = event["outcome"]
        attempt.report.error = event.fields.get("error")
        if event.fields.get("step") is not None:
            attempt.report.last_step = event["step"]
        attempt.restore_open = attempt.eval_open = False

    def _on_save(self, attempt: _Attempt, event: Event) -> None:
        elapsed = self._advance(event.t)
        stall = min(event["stall_s"], elapsed)
        self._accrue(attempt, elapsed - stall)
        self._buckets["checkpoint"] += stall

    def _on_loop_end(self, attempt: _Attempt, event: Event) -> None:
        fields = event.fields
        elapsed = self._advance(event.t)
        span = max(0.0, min(fields["seconds"], event.t - attempt.loop_floor))
        fresh = min(span, elapsed)
        self._accrue(attempt, elapsed - fresh)  # before the loop began
        taken = min(span - fresh, attempt.pending)  # the loop's time given to startup or other
        self._buckets["other" if attempt.loops else "startup"] -= taken
        length = fresh + taken
        attempt.pending = 0.0
        data_wait = min(fields["data_wait_s"], length)
        checkpoint_wait = min(fields["checkpoint_wait_s"], length - data_wait)
        # Replica groups: the detection of a dead group (and a join's wait) is other time, the
        # compute of the steps no group committed is lost progress -- neither is productive.
        stall = min(fields.get("stall_s", 0.0), length - data_wait - checkpoint_wait)
        discarded = min(fields.get("discarded_s", 0.0),
                        length - data_wait - checkpoint_wait - stall)
        compute = length - data_wait - checkpoint_wait - stall - discarded
        self._buckets["data_wait"] += data_wait
        self._buckets["checkpoint"] += checkpoint_wait
        self._buckets["lost_progress"] += discarded
        attempt.report.lost_s += discarded
        last, steps = fields["step"], fields["steps"]
        first = last - steps
        if self._loops and first < self._loops[-1].last:
            self._roll_back(first)  # the steps were trained again: a restore went unrecorded
        if steps:
            self._loops.append(_Loop(first, last, compute, len(self._attempts) - 1))
            self._productive += compute
            self._steps += steps
        else:
            self._buckets["other"] += compute
        attempt.loops += 1
        attempt.loop_floor = event.t
        report = attempt.report
        if report.first_step is None:
            report.first_step = first
        report.last_step = last

    def _roll_back(self, step: int) -> None:
        """Moves the compute of every surviving step above `step` to lost progress."""
        while self._loops and self._loops[-1].last > step:
            loop = self._loops.pop()
            if loop.first >= step:
                lost_steps, lost = loop.last - loop.first, loop.compute
            else:  # it straddles the step: the share above it is lost
                lost_steps = loop.last - step
                lost = loop.compute * lost_steps / (loop.last - loop.first)
                self._loops.append(_Loop(loop.first, step, loop.compute - lost, loop.attempt))
            self._productive -= lost
            self._steps -= lost_steps
            self._buckets["lost_progress"] += lost
            report = self._attempts[loop.attempt].report
            report.lost_steps += lost_steps
            report.lost_s += lost

    @property
    def loops(self) -> tuple[_Loop, ...]:
        """The loops whose steps survive so far (for a job's ideal step time, over groups)."""
        return tuple(self._loops)

    # ------------------------------------------------------------------ reporting

    def report(self, now: float | None = None, *, live: str | None = None,
               ideal: bool = True) -> GoodputReport:
        """The figures so far (the calculator is not changed).

        Args:
            now: the time of the report, for a live run (default: the clock).
            live: None for a run no process trains in; ``"attempt"`` when the last attempt's
                process still trains (its time up to `now` counts, as running); ``"starting"``
                when another process holds the run and has not recorded its ``start`` yet
                (the time up to `now` is between attempts).
            ideal: compute the ideal-step-time view (a sort of the surviving loops: leave it
                out of a report made at every loop of a long run).

        Raises:
            ValueError: for a `live` not in `LIVE`.
        """
        if live is not None and live not in LIVE:
            raise ValueError(f"`live` (got {live!r}) must be None, 'attempt' or 'starting'.")
        buckets = dict(self._buckets)
        attempts = [AttemptReport(**a.report.__dict__) for a in self._attempts]
        end = self._cursor
        if live is not None and self._attempts:
            now = time.time() if now is None else now
            tail = max(0.0, now - end)
            last = self._attempts[-1]
            if live == "attempt" and not last.ended:
                buckets[self._state(last)] += tail
                attempts[-1].end, attempts[-1].end_t = "running", max(now, end)
            else:
                buckets["between_attempts"] += tail
            end = max(now, end)
        wall = 0.0 if self._begin is None else end - self._begin
        productive = max(0.0, self._productive)
        known = math.fsum([productive, *(buckets[c] for c in BADPUT_CAUSES if c != "other")])
        other = wall - known
        # Disjoint buckets: only rounding can make it negative, by a hair of the wall time.
        buckets["other"] = max(0.0, other)
        report = GoodputReport(
            wall_s=wall, productive_s=productive,
            goodput=productive / wall if wall > 0 else None,
            badput_s={cause: buckets[cause] for cause in BADPUT_CAUSES},
            attempts=attempts, steps=self._steps,
            live=live is not None, skipped_lines=self.ignored)
        if ideal:
            self._ideal_view(report)
        return report

    def _ideal_view(self, report: GoodputReport) -> None:
        pace, slowdown = ideal_pace(self._loops)
        if pace is None:
            return
        report.ideal_step_s = pace
        report.slowdown_s = slowdown
        if report.wall_s > 0:
            report.ideal_goodput = max(0.0, report.productive_s - slowdown) / report.wall_s


def ideal_pace(loops: Iterable[_Loop]) -> tuple[float | None, float]:
    """The ideal step time of `loops` -- the median of their compute per step, each loop
    weighted by its steps -- and their slowdown: their compute beyond that pace (each loop's
    excess, never a negative one). ``(None, 0.0)`` without a step."""
    ordered = sorted(loops, key=lambda loop: loop.compute / (loop.last - loop.first))
    total = sum(loop.last - loop.first for loop in ordered)
    if not total:
        return None, 0.0
    seen, pace = 0, 0.0
    for loop in ordered:  # the median step time, each loop weighted by its steps
        seen += loop.last - loop.first
        if 2 * seen >= total:
            pace = loop.compute / (loop.last - loop.first)
            break
    return pace, math.fsum(max(0.0, loop.compute - (loop.last - loop.first) * pace)
                           for loop in ordered)


def goodput_of(events: Iterable[Event], *, now: float | None = None, live: str | None = None,
               ideal: bool = True) -> GoodputReport:
    """The `GoodputReport` of a run's record (`GoodputCalculator` fed `events`)."""
    calculator = GoodputCalculator()
    calculator.add_all(events)
    return calculator.report(now, live=live, ideal=ideal)


def run_goodput(run_dir: str | os.PathLike[str], *, now: float | None = None) -> GoodputReport:
    """The goodput report of a run directory, from its timeline files.

    Whether the run is live is asked of its ``train.lock`` without taking it
    (`cadence.core.run_dir.RunLock.holder`); `now` is when a live run is measured up to.

    Args:
        run_dir: the run's directory.
        now: the time of the report (default: the clock).

    Raises:
        ConfigError: if `run_dir` is not a directory, has no timeline, or its timeline holds no
            attempt; the message says why and what to do.
    """
    root = Path(run_dir)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise ConfigError(f"{str(root)!r} {what}: pass a run directory, e.g. "
                          "runs/<experiment>-<time>.")
    timeline = read_timeline(root)
    if not timeline.found:
        raise ConfigError(_no_timeline(root, timeline))
    now = time.time() if now is None else now
    if timeline.run:
        report = _report_of(timeline.run, _liveness(timeline.run,
                                                    RunDirectory(root).lock_file), now)
        if not report.attempts:
            raise ConfigError(
                f"The timeline of {str(root)!r} ({TIMELINE_DIR}/{RUN_FILE}) holds no attempt: "
                f"{len(timeline.run)} event(s) but no 'start'. It was not written by cadence, "
                "or was damaged.")
    replicas: list[GoodputReport] = []
    loops: list[_Loop] = []
    for group, events in sorted(timeline.replicas.items()):
        calculator = GoodputCalculator()
        calculator.add_all(events)
        lock = RunDirectory(root).replica_lock_file(group)
        replica = calculator.report(now, live=_liveness(events, lock))
        replica.replica = group
        replica.ranks = _rank_waits(events, timeline.replica_ranks.get(group, {}))
        replicas.append(replica)
        loops.extend(calculator.loops)
    if not timeline.run:  # the fault-tolerant mode: only the groups' records
        report = capacity_report(replicas, _groups_of(timeline), loops)
        report.ranks = [{**row, "replica": r.replica} for r in replicas for row in r.ranks]
    else:
        report.ranks = _rank_waits(timeline.run, timeline.ranks)
    report.replicas = replicas
    report.skipped_lines += timeline.skipped_lines
    return report


def _groups_of(timeline: RunTimeline) -> int:
    """How many replica groups the job has: what their ``start`` records say, at least as many
    as recorded."""
    said = [e.fields.get("replicas") for events in timeline.replicas.values() for e in events
            if e.event == "start"]
    return max([len(timeline.replicas), *(n for n in said if isinstance(n, int))])


def capacity_report(replicas: list[GoodputReport], groups: int,
                    loops: Iterable[_Loop] = ()) -> GoodputReport:
    """The job's report of a fault-tolerant run, in **capacity**: each of `groups` replica
    groups could have trained for the whole of the job's wall time (its first attempt's
    beginning to its last event, over every group), so the figures are group-seconds divided
    by `groups`. A group's own time goes to its own causes; the time it was absent -- before
    its first attempt, after its last, or never there -- is lost capacity, counted as
    ``between_attempts``, while the other groups trained on. The parts still add up to the
    wall time, and goodput is the share of the job's capacity that trained steps which
    survived. The ideal step time is that of every group's surviving `loops` (the groups step
    together), and the slowdown theirs, in capacity too. Each attempt names its group."""
    buckets = dict.fromkeys(BADPUT_CAUSES, 0.0)
    spans = [(r.attempts[0].start_t, r.attempts[-1].end_t) for r in replicas if r.attempts]
    if not spans or groups < 1:
        return GoodputReport(0.0, 0.0, None, buckets, [])
    wall = max(end for _, end in spans) - min(begin for begin, _ in spans)
    productive = 0.0
    for replica in replicas:
        productive += replica.productive_s
        for cause, seconds in replica.badput_s.items():
            buckets[cause] += seconds
        buckets["between_attempts"] += max(0.0, wall - replica.wall_s)
    buckets["between_attempts"] += (groups - len(replicas)) * wall  # never started
    attempts = sorted((a for r in replicas for a in r.attempts), key=lambda a: a.start_t)
    report = GoodputReport(
        wall_s=wall, productive_s=productive / groups,
        goodput=productive / (groups * wall) if wall > 0 else None,
        badput_s={cause: seconds / groups for cause, seconds in buckets.items()},
        attempts=attempts, steps=max(r.steps for r in replicas),
        live=any(r.live for r in replicas))
    pace, slowdown = ideal_pace(loops)
    if pace is not None:
        report.ideal_step_s, report.slowdown_s = pace, slowdown / groups
        if wall > 0:
            report.ideal_goodput = max(0.0, report.productive_s - report.slowdown_s) / wall
    return report


def _report_of(events: tuple[Event, ...], live: str | None, now: float) -> GoodputReport:
    calculator = GoodputCalculator()
    calculator.add_all(events)
    return calculator.report(now, live=live)


def _no_timeline(root: Path, timeline: RunTimeline) -> str:
    if timeline.refused:
        return f"The timeline of {str(root)!r} cannot be read: {timeline.refused[0]}"
    if (root / TIMELINE_DIR).is_dir():
        return (f"{str(root)!r} has a {TIMELINE_DIR}/ directory but no run record in it "
                f"({RUN_FILE}): no attempt of the run got as far as starting to train.")
    return (f"{str(root)!r} has no timeline ({TIMELINE_DIR}/{RUN_FILE}): it is not the directory "
            "of a run that recorded one. Every front-end records it in the run's directory -- "
            "run_experiment's and cadence train's model directory, a TrainLoop's "
            "checkpoint_dir, a tensorpack trainer's logdir, a Controller's record "
            "(Controller(record=cadence.RunRecord(RUN))) -- since cadence wrote timelines; "
            "pass that directory, or continue the run in it to start one.")


def _liveness(events: tuple[Event, ...], lock_file: Path) -> str | None:
    """Whether the run (a replica group's, with its lock) is live (`LIVE`), from its lock: is
    the holder the last attempt's process, or one that has not recorded its start yet?"""
    holder = RunLock(lock_file).holder()
    if holder is None:
        return None
    last = next((e for e in reversed(events) if e.event == "start"), None)
    if last is None:
        return "starting"
    same_pid = holder.get("pid") in (None, last.fields.get("pid"))
    same_host = holder.get("host") in (None, last.fields.get("host"))
    return "attempt" if same_pid and same_host else "starting"


def _rank_waits(record: Iterable[Event],
                others: Mapping[int, Iterable[Event]]) -> list[dict[str, Any]]:
    """Each rank's total waits, rank 0's from the run's (or the group's) `record`, the other
    ranks' from their own files; empty without rank files."""
    if not others:
        return []
    ranks: dict[int, Iterable[Event]] = {0: record, **others}
    rows = []
    for rank, events in sorted(ranks.items()):
        loops = [e for e in events if e.event == "loop_end"]
        rows.append({"rank": rank, "loops": len(loops),
                     "data_wait_s": math.fsum(e["data_wait_s"] for e in loops),
                     "checkpoint_wait_s": math.fsum(e["checkpoint_wait_s"] for e in loops)})
    return rows


# ---------------------------------------------------------------------------- the table


def format_report(report: GoodputReport, name: str | None = None) -> list[str]:
    """`report` as the lines of a readable table (what ``cadence goodput`` prints).

    Args:
        report: the report.
        name: what it is of (the run directory), for the first line.
    """
    wall = report.wall_s
    status = ", live" if report.live else ""
    lines = [f"{name or 'run'}: {len(report.attempts)} attempt(s), {report.steps} steps kept"
             f"{status}",
             f"  {'wall time':<18}{_seconds(wall):>12}   {_clock(wall)}",
             f"  {'productive':<18}{_seconds(report.productive_s):>12}"
             f"{_share(report.productive_s, wall):>9}   goodput",
             f"  badput by cause:{'seconds':>14}{'of wall':>9}"]
    for cause in BADPUT_CAUSES:
        seconds = report.badput_s[cause]
        lines.append(f"    {cause:<16}{_seconds(seconds):>12}{_share(seconds, wall):>9}")
    if report.ideal_step_s is not None:
        ideal = "-" if report.ideal_goodput is None else f"{100 * report.ideal_goodput:.1f} %"
        lines.append(f"  ideal step time {report.ideal_step_s:.4g} s; slowdown (within "
                     f"productive) {_seconds(report.slowdown_s)} = "
                     f"{_share(report.slowdown_s, wall)} of wall; ideal goodput {ideal}")
    grouped = any(attempt.replica is not None for attempt in report.attempts)
    group = f"{'group':>5}  " if grouped else ""
    lines.append(f"  {'#':>3}  {group}{'world':>5}  {'steps':<17}{'ended':<20}"
                 f"{'lost steps':>10}  {'lost time':>10}  restart  began")
    for index, attempt in enumerate(report.attempts, start=1):
        steps = ("-" if attempt.first_step is None else
                 f"{attempt.first_step}..{attempt.last_step}")
        ended = attempt.end + (f" ({attempt.signal})" if attempt.signal else "")
        began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(attempt.start_t))
        group = f"{'-' if attempt.replica is None else attempt.replica:>5}  " if grouped else ""
        lines.append(f"  {index:>3}  {group}{attempt.world_size:>5}  {steps:<17}{ended:<20}"
                     f"{attempt.lost_steps:>10}  {_seconds(attempt.lost_s):>10}  "
                     f"{attempt.restart:>7}  {began}")
        if attempt.slurm_job is not None:
            waited = (f"; {_seconds(attempt.waited_s)} between attempts before it (in Slurm's "
                      "queue)" if index > 1 else "")
            lines.append(f"       Slurm job {attempt.slurm_job} (step {attempt.slurm_step}), "
                         f"SLURM_RESTART_COUNT {attempt.slurm_restart}{waited}")
        if attempt.error:
            lines.append(f"       error: {attempt.error}")
    worst = report.worst_data_wait
    if worst is not None:
        replica = worst.get("replica")
        group = "" if replica is None else f"group {replica} "
        zero = next(row for row in report.ranks
                    if row["rank"] == 0 and row.get("replica") == replica)
        lines.append(f"  input wait by rank: {group}rank {worst['rank']} waited longest, "
                     f"{_seconds(worst['data_wait_s'])} over {worst['loops']} loops "
                     f"({group}rank 0: {_seconds(zero['data_wait_s'])})")
    for replica in report.replicas:
        lines.append(f"  replica group {replica.replica}: goodput "
                     f"{_share(replica.productive_s, replica.wall_s)} of "
                     f"{_seconds(replica.wall_s)}")
    if report.skipped_lines:
        lines.append(f"  skipped {report.skipped_lines} timeline line(s) that are not events "
                     "of this run's attempts (torn, damaged, or of another process)")
    return lines


def _seconds(seconds: float) -> str:
    return f"{seconds:,.1f} s"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole > 0 else "-"


def _clock(seconds: float) -> str:
    """Seconds as ``[Nd ]H:MM:SS``."""
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    text = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}d {text}" if days else text

