"""The Task Trainer variant plus an accuracy metric (what a classifier adds by choice)."""

DESCRIPTION = "cadence_trainer + an accuracy metric updated every step (argmax, compare, count)"


def build(x, y, workdir):
    import importlib.util
    from pathlib import Path

    import cadence

    spec = importlib.util.spec_from_file_location(
        "cadence_trainer_base", Path(__file__).with_name("cadence_trainer.py"))
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    return base.build(x, y, workdir, metrics={"accuracy": cadence.Accuracy})
