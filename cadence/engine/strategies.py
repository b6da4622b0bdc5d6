"""The names of the ways a model is spread over the ranks: ``runtime.strategy``'s values, and
the ``strategy`` of `cadence.engine.parallelize.prepare_model`; a pipeline's schedules.

They have a module of their own, without torch, so that a config checks them without importing
torch (as it checks the compile modes, `cadence.engine.compile.COMPILE_MODES`), and the config
and the distributed runtime read one tuple.
"""

STRATEGIES = ("auto", "none", "ddp", "fsdp2")
"""How a model is spread over the ranks (``runtime.strategy``): ``auto`` is DDP when there are
several ranks and the model trains, else none; ``fsdp2`` shards parameters, gradients and
optimizer state with ``torch.distributed.fsdp.fully_shard``."""

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
"""How a pipeline's microbatches run through its stages (``runtime.parallelism.pp_schedule``):
torch.distributed.pipelining's ``ScheduleGPipe``, ``Schedule1F1B`` and
``ScheduleInterleaved1F1B`` (`cadence.engine.pipeline`)."""


def stages_per_rank(schedule: str, given: int | None) -> int:
    """The stages each pipeline rank holds: `given`, else 2 for the interleaved schedule and 1
    for the others."""
    if given is not None:
        return given
    return 2 if schedule == "interleaved_1f1b" else 1
