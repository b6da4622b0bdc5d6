"""The names of the ways a model is spread over the ranks: ``runtime.strategy``'s values, and
the ``strategy`` of `cadence.engine.parallelize.prepare_model`.

They have a module of their own, without torch, so that a config checks them without importing
torch (as it checks the compile modes, `cadence.engine.compile.COMPILE_MODES`), and the config
and the distributed runtime read one tuple.
"""

STRATEGIES = ("auto", "none", "ddp", "fsdp2")
"""How a model is spread over the ranks (``runtime.strategy``): ``auto`` is DDP when there are
several ranks and the model trains, else none; ``fsdp2`` shards parameters, gradients and
optimizer state with ``torch.distributed.fsdp.fully_shard``."""
