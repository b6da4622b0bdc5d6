"""The TF Model Garden front-end (seed 002): configs and experiments, `Task`, `Trainer`,
optimizers and schedules from the config, `run_experiment` and the ``cadence`` command.

A front-end: it builds on the engine and imports no other front-end. The public names are
exported by `cadence`.
"""
