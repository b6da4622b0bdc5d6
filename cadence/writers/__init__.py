"""Metric writers: where scalar logs go, behind one protocol
(`cadence.core.protocols.MetricWriter`).

Each backend is one module, imported on first use by the name a `SummaryManager` is given
(``writers=["tensorboard", "jsonl"]``, the default). Nothing here imports torch.
"""
