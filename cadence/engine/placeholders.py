"""What stands where a part of a model holds no module: a pipeline stage's part is a copy of
the whole model in which each module the stage does not hold is a `StagePlaceholder`
(`cadence.engine.pipeline_stages` has the kinds: a block passed through, the stage's end, a
module never called). Its own module, beneath the code that walks a model's structure -- the
repeated blocks (`cadence.engine.parallelize`), a tensor-parallel plan
(`cadence.engine.tensor_parallel`), the model summary -- which each skip what a part does not
hold, and beneath the pipeline that makes the parts.
"""

from __future__ import annotations

from torch import nn


class StagePlaceholder(nn.Module):
    """Stands where a pipeline stage holds no module of the model; holds nothing itself.

    Args:
        name: the module it stands for.
        stage: the stage it is in.
    """

    def __init__(self, name: str, stage: int) -> None:
        super().__init__()
        self.replaced = name
        self.stage = stage

    def extra_repr(self) -> str:
        return f"{self.replaced!r} is not on stage {self.stage}"


def is_placeholder(module: nn.Module) -> bool:
    """Whether `module` stands for a module a pipeline stage does not hold."""
    return isinstance(module, StagePlaceholder)
