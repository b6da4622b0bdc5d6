"""Metric writers: where scalar logs go, behind one protocol
(`cadence.core.protocols.MetricWriter`).

Each backend is one module, imported on first use by the name a `SummaryManager` is given
(``writers=["tensorboard", "jsonl"]``, the default; also ``csv``, ``mlflow``, ``wandb``). MLflow
and W&B are optional dependencies, imported when their writer is built
(``pip install 'cadence[mlflow]'``, ``'cadence[wandb]'``). Nothing here imports torch.
"""
