"""The Task Trainer variant plus torchmetrics' accuracy (``benchmarks/metrics.py`` compares it with
``cadence_trainer_accuracy``)."""

DESCRIPTION = ("cadence_trainer + torchmetrics' MulticlassAccuracy(average='micro', "
               "validate_args=False) updated every step")


def build(x, y, workdir):
    from torchmetrics.classification import MulticlassAccuracy
    from workload import load_variant

    base = load_variant("cadence_trainer")
    return base.build(x, y, workdir, metrics={"accuracy": lambda: MulticlassAccuracy(
        num_classes=10, average="micro", validate_args=False)})
