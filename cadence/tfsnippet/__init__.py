"""The tfsnippet front-end (seed 004): `TrainLoop`, the imperative loop helper, and its events
(`EventKeys`, `EventSource`).

A front-end: it builds on the engine and imports no other front-end. The public names are
exported by `cadence`.
"""
