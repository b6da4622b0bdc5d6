"""The Task Trainer variant plus an accuracy metric (what a classifier adds by choice)."""

DESCRIPTION = "cadence_trainer + an accuracy metric updated every step (argmax, compare, count)"


def build(x, y, workdir):
    from workload import load_variant

    import cadence

    base = load_variant("cadence_trainer")
    return base.build(x, y, workdir, metrics={"accuracy": cadence.Accuracy})
