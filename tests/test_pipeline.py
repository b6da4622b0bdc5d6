"""Pipeline parallelism on gloo: the ``gpt`` experiment's layer stack split over 2 ranks
(``runtime.parallelism.pp=2``) by each schedule, and composed with tensor parallelism and
FSDP2 on 4 ranks; checkpoints that move out of a pipeline and back in; its export; the settings
refused -- the ``cadence`` command and `run_experiment` under torchrun, as a user launches them.

fp32, dropout 0, one global batch of 12: a pipeline changes only the order of the floating-point
sums (the microbatches' gradients are added one by one), so curves agree to ~1e-7 relative
(measured over 10 steps: 9e-8 for the losses, 2e-7 for the gradient norms, with GPipe, 1F1B and
interleaved 1F1B alike; 3e-7 at pp=2 x tp=2 and pp=2 x dp_shard=2); the tolerance is 1e-5, as
for the other layouts (``tests/test_parallelism.py``). The stage-splitting itself is tested in
one process in ``tests/engine/test_pipeline_stages.py``.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from test_parallelism import GPT, curves, move_between_layouts, refused
from test_real_models import (
    assert_same_state,
    failing_job,
    job,
    run,
    torchrun_command,
)

FOUR_BLOCKS = [*GPT, "task.model.n_layer=4"]
"""The small gpt with 4 blocks: 2 stages of 2, or 4 of 1 (interleaved, 2 stages per rank)."""


def train_and_evaluate(nproc, run_dir, settings, cwd):
    """``cadence train --mode train_and_eval`` in `nproc` processes (a plain process for 1)."""
    launcher = [sys.executable] if nproc == 1 else torchrun_command(nproc)
    command = [*launcher, "-m", "cadence", "train", "-e", "gpt", "-m", str(run_dir), "--mode",
               "train_and_eval"]
    for setting in settings:
        command += ["--set", setting]
    return run(command, cwd)


def evaluations(run_dir):
    """Each evaluation's loss and accuracy, as rank 0 recorded them."""
    lines = (run_dir / "eval" / "metrics.jsonl").read_text().splitlines()
    return [(record["validation_loss"], record["accuracy"]) for record in map(json.loads, lines)]


def losses_by_step(run_dir):
    """The training loss at each loop's end, by step, as rank 0 recorded them (a resumed run
    appends to the same file)."""
    lines = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record["training_loss"] for record in map(json.loads, lines)
            if "training_loss" in record}


@pytest.mark.slow
@pytest.mark.distributed
def test_each_schedule_follows_one_process(tmp_path):
    """The same model, data order and global batch: one process; 2 pipeline stages over 2 ranks
    with GPipe (2 microbatches) and 1F1B (4); 4 stages, 2 per rank, with interleaved 1F1B. Each
    loss and gradient norm (before clipping, which binds at 1.0: the total over every stage --
    a stage's own norm would be lower) is one process's, and so is each evaluation's loss and
    accuracy, the forward run through the stages."""
    settings = [*FOUR_BLOCKS, "trainer.train_steps=4", "trainer.steps_per_loop=1",
                "trainer.validation_interval=2"]
    one = tmp_path / "one"
    train_and_evaluate(1, one, settings, tmp_path)
    reference = curves(one)
    assert len(reference[0]) == 4 and min(reference[1]) > 1.0  # clipping at 1.0 binds
    evaluated = evaluations(one)
    assert len(evaluated) == 2
    schedules = {
        "gpipe": (["runtime.parallelism.pp_microbatches=2"],
                  "Pipeline of 2 stages over pp=2 (gpipe): stage 0: wte, wpe, blocks.0-1; "
                  "stage 1: blocks.2-3, ln_f, lm_head."),
        "1f1b": (["runtime.parallelism.pp_microbatches=4"],
                 "Pipeline of 2 stages over pp=2 (1f1b): "),
        "interleaved_1f1b": (["runtime.parallelism.pp_microbatches=4"],
                             "Pipeline of 4 stages over pp=2 (interleaved_1f1b): stage 0: wte, "
                             "wpe, blocks.0; stage 1: blocks.1; stage 2: blocks.2; stage 3: "
                             "blocks.3, ln_f, lm_head."),
    }
    for schedule, (more, said) in schedules.items():
        run_dir = tmp_path / schedule
        result = train_and_evaluate(2, run_dir, [
            *settings, "runtime.parallelism.pp=2", f"runtime.parallelism.pp_schedule={schedule}",
            *more], tmp_path)
        losses, norms = curves(run_dir)
        assert losses == pytest.approx(reference[0], rel=1e-5), (schedule, losses)
        assert norms == pytest.approx(reference[1], rel=1e-5), (schedule, norms)
        for got, expected in zip(evaluations(run_dir), evaluated, strict=True):
            assert got == pytest.approx(expected, rel=1e-5), (schedule, got, expected)
        assert result.stderr.count(said) == 1, result.stderr  # rank 0 says it, once
        records = [json.loads(line) for line in
                   (run_dir / "train" / "metrics.jsonl").read_text().splitlines()]
        # the metrics, computed on the last stage, are every rank's (rank 0 writes them)
        assert records[-1]["accuracy"] == pytest.approx(
            json.loads((one / "train" / "metrics.jsonl").read_text().splitlines()[-1])[
                "accuracy"], rel=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_pipeline_checkpoint_moves_to_one_process_and_back_and_the_losses_go_on(tmp_path):
    """Written at pp=2 x dp_shard=2 (FSDP2 on each stage), resumed in one process (FSDP2 in a
    group of one: a checkpoint written through DCP), then at pp=2 x tp=2: where each layout
    begins, the step is the last one's end and the whole model and optimizer, gathered from
    every stage and shard, are bit for bit what it saved; each step's loss is an uninterrupted
    run's. ``cadence export`` of the last checkpoint, in one process, is the whole model."""
    settings = [*GPT, "trainer.steps_per_loop=2", "trainer.checkpoint_interval=2",
                # the cosine over the 6 steps, however many steps each job is told to reach
                "trainer.optimizer_config.learning_rate.decay_steps=6"]
    straight = tmp_path / "straight"  # by the same job: its capture of the optimizer's state
    job(1, "gpt", straight, 6, tmp_path / "straight", settings)  # at step 0 initializes it
    uninterrupted = losses_by_step(straight)
    assert sorted(uninterrupted) == [2, 4, 6]
    run_dir = tmp_path / "run"
    layouts = [
        (4, ["runtime.parallelism.pp=2", "runtime.parallelism.dp_shard=2"],
         "pp=2 x dp_shard=2"),
        (1, ["runtime.strategy=fsdp2"], "one process"),
        (4, ["runtime.parallelism.pp=2", "runtime.parallelism.tp=2"], "pp=2 x tp=2"),
    ]
    begin, saved = move_between_layouts(tmp_path, run_dir, settings, layouts)
    assert set(saved["model"]) == set(begin["model"])  # every stage's parameters, by name
    resumed = losses_by_step(run_dir)
    assert sorted(resumed) == [2, 4, 6]
    assert [resumed[step] for step in (2, 4, 6)] == pytest.approx(
        [uninterrupted[step] for step in (2, 4, 6)], rel=1e-5)

    exported = tmp_path / "exported"
    run([sys.executable, "-m", "cadence", "export", str(run_dir), "--out", str(exported)],
        cwd=tmp_path)
    from safetensors.torch import load_file

    weights = load_file(exported / "model.safetensors")
    assert set(weights) <= set(saved["model"])
    assert set(saved["model"]) - set(weights) <= {"lm_head.weight"}  # tied: written once
    for key, tensor in weights.items():
        assert torch.equal(tensor, saved["model"][key]), key


@pytest.mark.slow
@pytest.mark.distributed
def test_a_pipeline_that_cannot_run_is_one_line_before_anything_is_written(tmp_path):
    """Microbatches that do not divide a data shard's batch and a pipeline with DDP are refused
    as the job starts, before the ranks meet (a process told
    it is rank 0 of 2 by torchrun's variables); a model whose forward cannot start a later
    stage, once the ranks have met -- each one line, exit status 2, nothing written."""
    two = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "1"}
    line = refused(tmp_path, ["runtime.parallelism.pp=2", "runtime.parallelism.pp_microbatches=5"],
                   env=two)
    assert line == (
        "cadence: error: runtime.parallelism.pp_microbatches=5 must divide each data shard's "
        "batch (task.train_data.global_batch_size=12 over 1 data shard): choose a global batch "
        "size that is a multiple of 5, or other microbatches."), line
    line = refused(tmp_path, ["runtime.parallelism.pp=2", "runtime.strategy=ddp"], env=two)
    assert "pp=2 with runtime.strategy=ddp: DDP holds a whole replica" in line, line

    run_dir = tmp_path / "char_lm"
    done = subprocess.run(
        [*torchrun_command(2), "-m", "cadence", "train", "-e", "char_lm", "-m", str(run_dir),
         "--set", "runtime.device=cpu", "--set", "runtime.parallelism.pp=2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0
    assert not run_dir.exists() or not any(run_dir.rglob("*")), sorted(run_dir.rglob("*"))
    errors = {line for line in done.stderr.splitlines() if line.startswith("cadence: error:")}
    assert errors == {
        "cadence: error: runtime.parallelism.pp > 1, and CharTransformer.forward takes no "
        "inputs_embeds: a pipeline stage after the first calls the model with inputs_embeds= the "
        "previous stage's hidden state (as transformers' decoders take it). Give its forward an "
        "inputs_embeds argument that skips the embeddings, or train it with pp=1."}, done.stderr
    # the first rank out exits 2 (torchrun then ends the other, which may not get there)
    assert "failed (exitcode: 2)" in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_pipeline_stopped_then_run_again_ends_bitwise_as_an_uninterrupted_run(tmp_path):
    """At pp=2, a run stopped after the checkpoint of step 2 and the same command run again to
    step 4 ends, bit for bit, where a run never stopped ends: the weights, the optimizer and the
    loss of the steps after the resume."""
    settings = [*GPT, "runtime.parallelism.pp=2", "trainer.steps_per_loop=2",
                "trainer.checkpoint_interval=2",
                "trainer.optimizer_config.learning_rate.decay_steps=4"]
    straight = tmp_path / "straight"
    job(2, "gpt", straight, 4, straight, settings)
    run_dir = tmp_path / "stopped"
    job(2, "gpt", run_dir, 2, tmp_path / "first", settings)
    job(2, "gpt", run_dir, 4, tmp_path / "again", settings)
    assert torch.load(tmp_path / "again-begin.pt", weights_only=True)["step"] == 2
    expected = torch.load(f"{straight}-end.pt", weights_only=True)
    ended = torch.load(tmp_path / "again-end.pt", weights_only=True)
    assert ended["step"] == 4
    assert_same_state(expected["model"], ended["model"], "model")
    assert_same_state(expected["optimizer"], ended["optimizer"], "optimizer")
    assert losses_by_step(run_dir) == losses_by_step(straight)  # exactly


@pytest.mark.slow
@pytest.mark.distributed
def test_a_nan_on_the_last_stage_stops_every_stage_before_the_checkpoint(tmp_path):
    """A NaN written into the last stage's final norm after the loop's last step: the loop's
    loss is finite and the first stage's weights are, and still both stages refuse to save
    those weights -- the first naming another stage -- and the job ends, no hang."""
    run_dir = tmp_path / "run"
    result = failing_job(2, "gpt", run_dir, 4, tmp_path / "nan",
                         [*GPT, "runtime.parallelism.pp=2", "trainer.steps_per_loop=2",
                          "trainer.checkpoint_interval=2"], {"POISON": "2:1:ln_f.weight"})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    for rank, where in ((0, "weights of another pipeline stage"), (1, "ln_f.weight")):
        assert (f"[rank{rank}]: cadence.core.errors.DivergenceError: Training diverged at step 2: "
                f"the weights about to be checkpointed are not finite (NaN or infinity in "
                f"{where})") in output, output[-4000:]
    assert not (run_dir / "checkpoints").exists() or not os.listdir(run_dir / "checkpoints")
