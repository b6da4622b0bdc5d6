"""How `TrainLoop` writes its lines: metric order and values, durations, the parameter table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from cadence.core.logs import humanize_duration


def is_time_metric(name: str) -> bool:
    """Metrics whose names end in ``time`` or ``timer`` are durations."""
    return name.endswith("time") or name.endswith("timer")


class DefaultMetricFormatter:
    """Orders metrics (durations first, then by name) and formats their values."""

    def sort_metrics(self, names: Iterable[str]) -> list[str]:
        return sorted(names, key=lambda n: (not is_time_metric(n), n))

    def format_metric(self, name: str, value: float) -> str:
        if is_time_metric(name):
            return humanize_duration(value)
        return f"{value:.6g}"


def format_stats(stats: Mapping[str, tuple[float, float | None]],
                 formatter: DefaultMetricFormatter) -> str:
    """``name: mean (±std); ...`` for ``{name: (mean, std or None)}``."""
    texts = []
    for name in formatter.sort_metrics(stats):
        mean, std = stats[name]
        text = f"{name.replace('_', ' ')}: {formatter.format_metric(name, mean)}"
        if std is not None:
            text += f" (±{formatter.format_metric(name, std)})"
        texts.append(text)
    return "; ".join(texts)


def parameter_table(title: str, params: Mapping[str, torch.Tensor],
                    rule: str = "-") -> list[str]:
    """The lines of a table of parameters -- name, shape, count, in the order given -- under a
    title with their total."""
    total = sum(p.numel() for p in params.values())
    header = f"{title} ({total:,} in total)"
    rows = [(name, str(tuple(p.shape)), f"{p.numel():,}") for name, p in params.items()]
    widths = [max([len(r[i]) for r in rows] + [0]) for i in range(3)]
    lines = [header, rule * max(len(header), sum(widths) + 4)]
    lines += [f"{n:<{widths[0]}}  {s:<{widths[1]}}  {c:>{widths[2]}}" for n, s, c in rows]
    return lines


def parameter_summary(named: Mapping[str, torch.Tensor], var_groups: list[str] | None) -> list[str]:
    """`TrainLoop.print_training_summary`'s tables, as tfsnippet's ``summarize_variables``:
    the parameters in their own order, one table per group with its total and, when there are
    groups, the grand total of the trainable parameters above them."""
    groups = parameter_groups(named, var_groups)
    lines: list[str] = []
    trainable = [members for title, members in groups if title != "Other Parameters"]
    if len(trainable) > 1:
        total = sum(p.numel() for members in trainable for p in members.values())
        header = f"Trainable Parameters ({total:,} in total)"
        lines += [header, "=" * len(header), ""]
    for title, members in groups:
        lines += [*parameter_table(title, members), ""]
    return lines


def parameter_groups(named: Mapping[str, torch.Tensor],
                     var_groups: list[str] | None) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """The trainable parameters split by the name prefixes in `var_groups` (the rest in "Other
    Trainable Parameters"), then the parameters that are not trained, as (title, members), each
    in the order of `named`."""
    trainable = {n: p for n, p in named.items() if p.requires_grad}
    other = {n: p for n, p in named.items() if not p.requires_grad}
    groups: list[tuple[str, dict[str, torch.Tensor]]] = []
    if var_groups:
        rest = dict(trainable)
        for prefix in var_groups:
            members = {n[len(prefix):].lstrip("./"): p for n, p in trainable.items()
                       if n.startswith(prefix)}
            for n in list(rest):
                if n.startswith(prefix):
                    del rest[n]
            if members:
                groups.append((f"Trainable Parameters ({prefix})", members))
        if rest and groups:
            groups.append(("Other Trainable Parameters", rest))
    if not groups:
        groups = [("Trainable Parameters", trainable)]
    if other:
        groups.append(("Other Parameters", other))
    return groups


def environment_lines() -> list[str]:
    """The lines of `TrainLoop.print_training_summary` that describe where the loop runs."""
    import platform
    import sys

    from cadence import __version__
    from cadence.engine.runtime import current_runtime, device_name

    device = device_name(current_runtime().device)
    return [
        "Execution environment",
        f"  Python {platform.python_version()} ({sys.executable}), torch {torch.__version__},"
        f" cadence {__version__}, {device}, {torch.get_num_threads()} threads",
        "",
    ]
