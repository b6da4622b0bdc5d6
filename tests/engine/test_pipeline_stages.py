"""A model split into pipeline stages, in one process: where it is split (evenly over its
repeated blocks, the first stages taking one more where they do not divide; or as the user
lists), each stage a part that keeps the model's parameter names, a tied embedding and head held
by the first and the last stage, and the stages run one after another computing the model's
own logits and gradients. The stages across processes are in ``tests/test_pipeline.py``.
"""

import pytest
import torch
from torch import nn

from cadence.core.errors import ConfigError
from cadence.engine.pipeline_stages import (
    NotOnStage,
    SkippedBlock,
    StageEnd,
    StageModule,
    check_splittable,
    plan_stages,
    shared_parameters,
    stage_part,
)
from cadence.engine.placeholders import is_placeholder
from cadence.task.experiments.char_lm import CharLMModelConfig, CharTransformer
from cadence.task.experiments.gpt import GPT, GPTModelConfig


def gpt(n_layer=4):
    torch.manual_seed(0)
    return GPT(GPTModelConfig(n_layer=n_layer, n_head=2, n_embd=16, block_size=8))


def tokens(batch=4, length=8, seed=0):
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def held(part):
    """The names of the parameters a stage's part holds (a tied one once, by its first name)."""
    return {name for name, _ in part.module.named_parameters()}


@pytest.mark.parametrize("n_layer, stages, expected", [
    (4, 2, [["wte", "wpe", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "ln_f", "lm_head"]]),
    (5, 2, [["wte", "wpe", "blocks.0", "blocks.1", "blocks.2"],
            ["blocks.3", "blocks.4", "ln_f", "lm_head"]]),
    (5, 3, [["wte", "wpe", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3"],
            ["blocks.4", "ln_f", "lm_head"]]),
    (4, 4, [["wte", "wpe", "blocks.0"], ["blocks.1"], ["blocks.2"],
            ["blocks.3", "ln_f", "lm_head"]]),
])
def test_blocks_are_split_evenly_the_first_stages_taking_one_more(n_layer, stages, expected):
    plan = plan_stages(gpt(n_layer), stages)
    assert [list(names) for names in plan.stages] == expected
    assert plan.blocks == {f"blocks.{index}" for index in range(n_layer)}


def test_the_plan_in_words_names_each_stages_modules():
    assert plan_stages(gpt(4), 2).describe() == (
        "stage 0: wte, wpe, blocks.0-1; stage 1: blocks.2-3, ln_f, lm_head")


def test_each_stage_keeps_the_models_parameter_names_and_values():
    model = gpt(5)
    plan = plan_stages(model, 3)
    whole = dict(model.named_parameters())
    parts = [stage_part(model, plan, index) for index in range(3)]
    assert held(parts[0]) == {name for name in whole if name.startswith(("wte", "wpe",
                                                                         "blocks.0.", "blocks.1."))}
    assert held(parts[1]) == {name for name in whole if name.startswith(("blocks.2.", "blocks.3."))}
    # the last stage holds its head, whose weight is the embedding's (kept under its own name)
    assert held(parts[2]) == {name for name in whole if name.startswith(("blocks.4.", "ln_f"))} | {
        "wte.weight"}
    assert set().union(*map(held, parts)) == set(whole)
    for part in parts:
        for name, parameter in part.module.named_parameters():
            assert torch.equal(parameter, whole[name]), name
            assert parameter is not whole[name]  # a copy: the model itself is left whole
    # what a stage does not hold is a placeholder that holds nothing
    middle = parts[1].module
    assert isinstance(middle.blocks[0], SkippedBlock) and isinstance(middle.wte, NotOnStage)
    assert isinstance(middle.blocks[4], StageEnd) and isinstance(middle.lm_head, StageEnd)
    assert not any(True for _ in middle.blocks[0].parameters())
    assert is_placeholder(middle.ln_f) and not is_placeholder(middle.blocks[2])


def test_a_tied_embedding_and_head_are_held_by_the_first_and_the_last_stage():
    model = gpt(4)
    plan = plan_stages(model, 4)
    assert shared_parameters(model, plan) == {"wte.weight": (0, 3)}
    first, middle, last = (stage_part(model, plan, index) for index in (0, 1, 3))
    assert first.shared == {"wte.weight": (0, 3)} and last.shared == {"wte.weight": (0, 3)}
    assert middle.shared == {}
    # the last stage keeps the embedding module as the holder of the tied weight: its head's
    # weight is that parameter, under the model's own first name
    assert last.module.lm_head.weight is last.module.wte.weight
    assert "wte.weight" in dict(last.module.named_parameters())
    assert isinstance(last.module.wpe, NotOnStage)


def chain(model, plan, x):
    """The stages of `plan` run one after another as pipelining runs them; each stage's
    module, and the logits."""
    stages = len(plan.stages)
    modules = [StageModule(stage_part(model, plan, index).module, first=index == 0,
                           last=index == stages - 1) for index in range(stages)]
    features = modules[0].feature_arguments(x)
    hidden = modules[0](**features)
    for module in modules[1:]:
        hidden = module(hidden, **features)
    return modules, hidden


@pytest.mark.parametrize("stages", [2, 3])
def test_stages_run_one_after_another_compute_the_models_logits_and_gradients(stages):
    model = gpt(3)
    x = tokens()
    modules, logits = chain(model, plan_stages(model, stages), x)
    expected = model(x)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), x.roll(-1, 1).flatten())
    loss.backward()
    nn.functional.cross_entropy(expected.flatten(0, 1), x.roll(-1, 1).flatten()).backward()
    whole = dict(model.named_parameters())
    summed = {}
    for module in modules:
        for name, parameter in module.part.named_parameters():
            summed[name] = summed.get(name, 0) + parameter.grad
    assert set(summed) == set(whole)
    for name, grad in summed.items():
        # the tied weight's gradient is the sum of the first and the last stage's
        torch.testing.assert_close(grad, whole[name].grad, rtol=1e-5, atol=1e-7)
    embedding = [module.part.wte.weight.grad for module in (modules[0], modules[-1])]
    assert all(grad.abs().sum() > 0 for grad in embedding)  # each stage has its own share


def test_stages_given_by_name_are_taken_as_given():
    model = gpt(4)
    given = [["wte", "wpe", "blocks.0"], ["blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head"]]
    plan = plan_stages(model, 2, given)
    assert [list(names) for names in plan.stages] == given
    modules, logits = chain(model, plan, tokens())
    assert {name.split(".")[1] for name, _ in modules[1].part.named_parameters()
            if name.startswith("blocks.")} == {"1", "2", "3"}
    torch.testing.assert_close(logits, model(tokens()), rtol=0, atol=0)


@pytest.mark.parametrize("given, says", [
    ([["wte", "wpe", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "lm_head"]],
     r"parameters in no stage \['ln_f\.weight', 'ln_f\.bias'\]"),
    # the head's weight is the embedding's: it is left out all the same
    ([["wte", "wpe", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "ln_f"]],
     r"parameters in no stage \['lm_head\.weight'\]"),
    ([["wte", "wpe", "blocks.0", "blocks.1"], ["blocks.1", "blocks.2", "blocks.3", "ln_f",
                                                "lm_head"]], r"modules named twice \['blocks.1'\]"),
    ([["wte", "wpe", "blocks.0", "blocks.9"], ["blocks.1", "blocks.2", "blocks.3", "ln_f",
                                                "lm_head"]], r"unknown modules \['blocks.9'\]"),
    ([["wte", "wpe", "blocks"], []], r"stages without a module \[1\]"),
    ([["wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head"]],
     r"gives 1 stages and the job has 2"),
])
def test_a_given_split_that_does_not_cover_the_model_once_is_refused(given, says):
    with pytest.raises(ConfigError, match=r"^runtime\.parallelism\.pp_stage_modules .*" + says):
        plan_stages(gpt(4), 2, given)


def test_more_stages_than_blocks_is_refused_naming_the_blocks():
    with pytest.raises(ConfigError, match=r"4 pipeline stages \(pp x pp_stages_per_rank\) and "
                                          r"GPT has 3 blocks \(blocks\.0\.\.\.blocks\.2\)"):
        plan_stages(gpt(3), 4)


def test_a_model_without_repeated_blocks_is_refused_naming_how_to_give_the_split():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(ConfigError, match=r"cannot split Sequential: it has no repeated blocks"
                                          r".*runtime\.parallelism\.pp_stage_modules"):
        plan_stages(model, 2)


def test_a_model_whose_forward_takes_no_inputs_embeds_is_refused_in_one_line():
    model = CharTransformer(CharLMModelConfig(num_layers=2, num_heads=2, d_model=16,
                                              dim_feedforward=32), sequence_length=8)
    with pytest.raises(ConfigError) as refused:
        check_splittable(model)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("runtime.parallelism.pp > 1, and CharTransformer.forward takes no "
                              "inputs_embeds"), message
    check_splittable(gpt(2))  # the gpt experiment's does


def test_a_stage_takes_a_tensor_or_a_dict_of_keyword_arguments_and_nothing_else():
    module = StageModule(stage_part(gpt(2), plan_stages(gpt(2), 2), 0).module, first=True,
                         last=False)
    x = tokens()
    assert module.feature_arguments(x).keys() == {"input_ids"}
    assert module.feature_arguments({"input_ids": x, "position_ids": x}).keys() == {
        "input_ids", "position_ids"}
    with pytest.raises(TypeError, match=r"as a tensor or a dict .* \(got list\)"):
        module.feature_arguments([x])
