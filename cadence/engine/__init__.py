"""The engine's torch half: `Module` (seed 000's tracking), the runner protocol and the standard
runners, compiled steps, checkpoints (`CheckpointManager`, the I/O backends, RNG state), metrics
accumulated on the device, the best-weights exporter, and the host-sync counter.

It builds on `cadence.core` and `cadence.data`; no front-end is imported from here. The public
names are exported by `cadence`.
"""
