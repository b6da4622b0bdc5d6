"""The run's records: what a run lived through and what it cost, kept in its directory.

- `cadence.records.timeline`: the run timeline, a file format (one JSON line per event) with
  its writer and its reader of untrusted input.
- `cadence.records.goodput`: goodput and badput by cause from a timeline (``cadence goodput``),
  an offline report that a live run also keeps as it goes.
- `cadence.records.run_record`: the record a training process keeps of its attempt (its
  timeline, and on rank 0 the goodput so far), handed to the engine's Controller through
  `cadence.core.protocols.RunRecordLike`.

This layer sits just above `cadence.core`, whose run directory and file helpers it uses; the
engine only sees it through that protocol. Nothing here imports torch.
"""
