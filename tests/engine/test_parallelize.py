"""How a real model is parallelized: per repeated block, tied parameters together, with
activation checkpointing and compile per block, through a hook the Task owns.

FSDP2 and DDP run here in this process, in a process group of one (what `prepare_model` makes
when there is no torchrun job); the multi-process runs are in ``tests/test_real_models.py``.
"""

import re

import pytest
import torch
from torch import nn

import cadence
from cadence.engine.parallelize import (
    ParallelOptions,
    describe_blocks,
    find_repeated_blocks,
    name_pattern,
    parallelize_model,
    prepare_model,
    repeated_blocks,
    unwrap_model,
    unwrapped_name,
)
from cadence.engine.runtime import shutdown
from cadence.task.experiments.char_lm import CharLMModelConfig, CharTransformer
from cadence.task.experiments.gpt import GPT, GPTModelConfig

TINY = GPTModelConfig(n_layer=3, n_head=2, n_embd=16, block_size=8)


@pytest.fixture
def one_process_group():
    """DDP and FSDP2 in this process: `prepare_model` makes a group of one; removed after."""
    yield
    shutdown()


def tokens(batch=4, length=8, seed=0):
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def loss_and_grads(model, trained=None):
    trained = trained or model
    x = tokens()
    loss = nn.functional.cross_entropy(trained(x).flatten(0, 1), x.roll(-1, 1).flatten())
    loss.backward()
    grads = {unwrapped_name(name): p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    return loss.detach(), grads


def test_the_blocks_of_a_gpt_and_of_torchs_transformer_encoder_are_found():
    gpt = GPT(TINY)
    assert repeated_blocks(gpt) == list(gpt.blocks)
    char_lm = CharTransformer(CharLMModelConfig(num_layers=2, d_model=16, num_heads=2,
                                                dim_feedforward=32), 8)
    assert repeated_blocks(char_lm) == list(char_lm.blocks.layers)


def test_a_list_of_mixed_layers_is_not_blocks_and_a_tied_block_stays_with_the_root():
    mixed = nn.ModuleDict({"layers": nn.ModuleList([nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)])})
    assert repeated_blocks(mixed) == []
    model = GPT(TINY)
    model.blocks[1].mlp.c_fc.weight = model.blocks[0].mlp.c_fc.weight  # tied across blocks
    assert repeated_blocks(model) == [model.blocks[2]]


def test_activation_checkpointing_keeps_the_names_the_loss_and_the_gradients():
    torch.manual_seed(0)
    plain = GPT(TINY)
    checkpointed = GPT(TINY)
    checkpointed.load_state_dict(plain.state_dict())
    parallelize_model(checkpointed, None, ParallelOptions(activation_checkpointing=True))
    assert "CheckpointWrapper" in type(checkpointed.blocks[0]).__name__
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    loss, grads = loss_and_grads(plain)
    loss_ac, grads_ac = loss_and_grads(checkpointed)
    assert torch.equal(loss, loss_ac)
    for name, grad in grads.items():
        assert torch.allclose(grad, grads_ac[name], atol=1e-6), name


@pytest.mark.slow
def test_compiled_blocks_keep_the_state_dict_and_compute_the_same_loss():
    torch.manual_seed(0)
    plain = GPT(TINY)
    compiled = GPT(TINY)
    compiled.load_state_dict(plain.state_dict())
    parallelize_model(compiled, None, ParallelOptions(compile_blocks=True))
    assert list(compiled.state_dict()) == list(plain.state_dict())
    loss, _ = loss_and_grads(plain)
    loss_compiled, _ = loss_and_grads(compiled)
    assert torch.allclose(loss, loss_compiled, atol=1e-5)


def test_fsdp2_shards_each_block_and_the_tied_embedding_and_head_together(one_process_group):
    """The report: ``fully_shard`` on each direct child put the tied head and embedding in two
    groups ("shared with a parameter already managed by another FSDP group")."""
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = GPT(TINY)
    reference = GPT(TINY)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    trained = prepare_model(model, "fsdp2", torch.device("cpu"), optimizers=[optimizer])
    assert trained is model and model.lm_head.weight is model.wte.weight
    assert all(isinstance(p, DTensor) for p in model.parameters())
    groups = [type(m).__name__ for m in model.modules() if "FSDP" in type(m).__name__]
    assert groups.count("FSDPBlock") == TINY.n_layer and groups.count("FSDPGPT") == 1
    assert all(p in set(model.parameters()) for p in optimizer.param_groups[0]["params"])
    loss, _ = loss_and_grads(reference)
    sharded_loss, _ = loss_and_grads(model)
    assert torch.allclose(loss, sharded_loss, atol=1e-6)


def test_fsdp2_mixed_precision_computes_in_bf16_and_keeps_fp32_weights(one_process_group):
    model = GPT(TINY)
    options = ParallelOptions(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    prepare_model(model, "fsdp2", torch.device("cpu"), options=options)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the sharded weights
    assert model(tokens()).dtype == torch.bfloat16


def test_ddp_in_one_process_wraps_the_model_and_trains(one_process_group):
    model = GPT(TINY)
    trained = prepare_model(model, "ddp", torch.device("cpu"))
    assert isinstance(trained, nn.parallel.DistributedDataParallel) and trained.module is model
    loss, grads = loss_and_grads(model, trained)
    assert torch.isfinite(loss) and all(g.abs().sum() > 0 for g in grads.values())


def test_a_parallelize_hook_that_builds_a_new_model_is_refused(one_process_group):
    model = GPT(TINY)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="optimizer holds parameters the trained model"):
        prepare_model(model, "none", torch.device("cpu"), optimizers=[optimizer],
                      parallelize=lambda model, mesh, options: GPT(TINY))


class RecordingTask(cadence.Task):
    """A task that shards its own way (every other block), and says what it was given."""

    seen: list = []

    def build_model(self):
        return GPT(TINY)

    def build_inputs(self, params, input_context=None):
        x = tokens(8)
        return [(x, x.roll(-1, 1))] * 4

    def build_losses(self, labels, model_outputs, aux_losses=None):
        return nn.functional.cross_entropy(model_outputs.flatten(0, 1), labels.flatten())

    def parallelize(self, model, runtime, options):
        RecordingTask.seen.append((runtime, options))
        return parallelize_model(model, runtime, options, blocks=list(model.blocks)[::2])


def test_a_task_chooses_how_its_model_is_parallelized(one_process_group):
    config = cadence.load_config(cadence.ExperimentConfig(), overrides=[
        "trainer.train_steps=2", "trainer.steps_per_loop=1", "runtime.device=cpu",
        "runtime.strategy=fsdp2", "runtime.fsdp.param_dtype=bf16",
        "runtime.fsdp.reduce_dtype=fp32", "runtime.activation_checkpointing=true"])
    task = RecordingTask(config.task)
    model = task.build_model()
    trainer = cadence.Trainer(config, task, model, torch.optim.AdamW(model.parameters()),
                              evaluate=False)
    runtime, options = RecordingTask.seen[-1]
    mesh = runtime.mesh_of("dp_replicate", "dp_shard")  # FSDP2's, in a group of one
    assert mesh.mesh_dim_names == ("dp_shard",) and mesh.size() == 1
    assert runtime.dp_size == 1 and runtime.mesh_of("tp") is None
    assert (options.strategy, options.param_dtype, options.reduce_dtype,
            options.activation_checkpointing) == ("fsdp2", torch.bfloat16, torch.float32, True)
    wrapped = ["CheckpointWrapper" in type(block).__name__ for block in model.blocks]
    assert wrapped == [True, False, True]
    trainer.train(2)
    assert trainer.global_step == 2


def test_parallelize_model_refuses_an_unresolved_strategy_or_a_missing_mesh():
    with pytest.raises(ValueError, match="resolve 'auto' with resolve_strategy first"):
        parallelize_model(GPT(TINY), None, ParallelOptions(strategy="auto"))
    with pytest.raises(ValueError, match="needs a device mesh"):
        parallelize_model(GPT(TINY), None, ParallelOptions(strategy="fsdp2"))


@pytest.mark.parametrize(("setting", "says"), [
    ("task.model.vocab_size=100", "task.model.vocab_size (got 100) must be >= 256"),
    ("task.sequence_length=200", "task.sequence_length (got 200) must be in [1, "
                                 "task.model.block_size = 128]"),
    ("task.model.n_embd=30", "task.model.n_embd (got 30) must be a multiple of "
                             "task.model.n_head (got 4)"),
])
def test_a_gpt_that_cannot_be_built_is_one_config_error_naming_the_key(setting, says):
    config = cadence.load_config("gpt", overrides=[setting])
    from cadence.task.registry import get_task

    with pytest.raises(cadence.ConfigError, match=re.escape(says)):
        get_task(config.task).build_model()



class Residual(nn.Module):
    """A block as timm writes one: a composite module, repeated in an ``nn.Sequential``."""

    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Stage(nn.Module):
    """A stage of its own width: a projection, then its blocks (timm ConvNeXt's stages)."""

    def __init__(self, width, depth):
        super().__init__()
        self.project = nn.Linear(4, width)
        self.blocks = nn.Sequential(*(Residual(width) for _ in range(depth)))


def test_blocks_in_a_sequential_are_found_and_small_sequentials_of_layers_are_not():
    vit = nn.Module()
    vit.stem = nn.Sequential(nn.Conv2d(3, 4, 2), nn.BatchNorm2d(4))  # mixed layers
    vit.blocks = nn.Sequential(Residual(4), Residual(4), Residual(4))
    vit.head = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))  # layers of one torch class
    vit.wrapped = nn.Sequential(nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4)))
    vit.single = nn.Sequential(Residual(4))  # one is not repeated
    found = find_repeated_blocks(vit)
    assert found.blocks == list(vit.blocks) and found.names == ["blocks.0", "blocks.1", "blocks.2"]


def test_stages_of_different_widths_are_looked_into_and_blocks_holding_experts_are_not():
    convnext = nn.Module()
    convnext.stages = nn.Sequential(Stage(4, 2), Stage(8, 2), Stage(16, 1))
    found = find_repeated_blocks(convnext)
    assert found.names == ["stages.0.blocks.0", "stages.0.blocks.1", "stages.1.blocks.0",
                           "stages.1.blocks.1"]  # a stage of one block keeps it in the root
    same = nn.Module()
    same.stages = nn.Sequential(Stage(4, 2), Stage(4, 2))  # repeated as they are
    assert find_repeated_blocks(same).names == ["stages.0", "stages.1"]
    from user_moe import MoEConfig, MoEDecoder

    moe = MoEDecoder(MoEConfig(), 8)
    assert find_repeated_blocks(moe).blocks == list(moe.blocks)  # not their experts


def test_the_plan_is_one_line_with_the_units_the_wrappers_and_the_blocks_left_out(
        one_process_group, caplog):
    model = GPT(TINY)
    model.blocks[1].mlp.c_fc.weight = model.blocks[0].mlp.c_fc.weight  # tied across blocks
    with caplog.at_level("INFO", logger="cadence"):
        prepare_model(model, "fsdp2", torch.device("cpu"),
                      options=ParallelOptions(activation_checkpointing=True))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Parallel")]
    assert line == (
        "Parallelized (fsdp2): FSDP2 units blocks.2 (Block) and the root GPT (the rest); "
        "activation checkpointing blocks.2; not units, left to the root: blocks.0 (a parameter "
        "tied to one outside it), blocks.1 (a parameter tied to one outside it).")


def test_name_patterns_join_consecutive_children_of_one_container():
    names = ["model.layers.0", "model.layers.1", "model.layers.2", "model.layers.3"]
    layers = [nn.Linear(1, 1) for _ in names]
    assert describe_blocks(names, layers) == "model.layers.0-3 (Linear)"
    assert name_pattern(["a.0", "a.1", "b.0", "b.1", "a.3"]) == "a.0-1, b.0-1, a.3"


def test_the_users_model_is_found_inside_ddp_and_compile_wrappers(one_process_group):
    model = GPT(TINY)
    assert unwrap_model(prepare_model(model, "ddp", torch.device("cpu"))) is model
    assert unwrap_model(torch.compile(model)) is model
