"""Which way a metric improves: one vocabulary for every front-end.

Early stopping, the best-weights exporters and the savers compare values of a monitored metric.
They name the direction in their seeds' words (``mode="min"``, ``metric_comp="lower"``,
``smaller_is_better=True``, ``MinSaver``); all of them mean ``"min"`` or ``"max"`` here. When a
direction is not given it is inferred from the metric's name.
"""

from __future__ import annotations

import re

LARGER_IS_BETTER = ("acc", "accuracy", "auc", "f1", "precision", "recall", "iou", "bleu", "map",
                    "dice", "r2")
"""Name parts that make a validation metric larger-is-better when the direction is not given."""

def infer_smaller_is_better(name: str) -> bool:
    """Whether smaller values of the metric `name` are better, from its name (see
    `LARGER_IS_BETTER`).

    >>> infer_smaller_is_better("valid_loss"), infer_smaller_is_better("valid_auc")
    (True, False)
    """
    parts = re.split(r"[^a-z0-9]+", name.lower())
    return not any(part in LARGER_IS_BETTER for part in parts)
