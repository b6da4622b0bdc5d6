"""Training that does not fit one axis, on gloo: tensor parallelism alone and composed with FSDP2,
HSDP, checkpoints that move between layouts, and the layouts refused before anything is
written -- the ``cadence`` command and `run_experiment` under torchrun, as a user launches them.

The model is the ``gpt`` experiment (GPT-2's decoder: tied embedding and head, blocks in a
ModuleList; its own tensor-parallel plan) and a transformers ``LlamaForCausalLM`` (the plan its
config declares). fp32, dropout 0, one global batch: a layout changes only the order of the
floating-point sums, so curves agree to ~1e-6 relative (measured: identical to the printed
digits at tp=2 and dp_shard=2 x tp=2 over 20 steps); the tolerance is 1e-5.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_real_models import (
    DATA,
    JOB,
    SMALL,
    assert_same_state,
    cadence_train,
    job,
    run,
    torchrun_command,
)
from test_replica_groups import kill_tree

GPT = [*SMALL["gpt"], *DATA, "runtime.device=cpu",
       "trainer.optimizer_config.learning_rate.warmup_steps=0"]
"""The small gpt, fp32, one global batch of 12 for every layout; GPT-2's clipping at 1.0, which
binds here (the norms are 2-4)."""


def curves(run_dir):
    """Each loop's training loss and gradient norm (before clipping), as rank 0 recorded them."""
    lines = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    records = [record for record in map(json.loads, lines) if "training_loss" in record]
    return ([r["training_loss"] for r in records], [r["gradient_norm"] for r in records])


def move_between_layouts(tmp_path, run_dir, settings, layouts, after_each=None):
    """Trains the ``gpt`` experiment 2 steps in each of `layouts` -- ``(processes, settings,
    name)`` -- in turn, on one run: where each layout begins, the whole model and optimizer,
    gathered from its shards, are bit for bit those the layout before saved, and the resume
    line names both layouts and says the state was resharded from its shards (DCP).
    ``after_each(name, end)`` runs after each layout; returns the last one's whole state where
    it began and where it ended."""
    saved = None
    for index, (nproc, layout, name) in enumerate(layouts):
        prefix = tmp_path / f"layout-{index}"
        job(nproc, "gpt", run_dir, 2 * (index + 1), prefix, [*settings, *layout])
        begin = torch.load(f"{prefix}-begin.pt", weights_only=True)
        end = torch.load(f"{prefix}-end.pt", weights_only=True)
        assert (begin["step"], end["step"]) == (2 * index, 2 * (index + 1))
        if saved is not None:
            assert_same_state(saved["model"], begin["model"], f"{name}: model")
            assert_same_state(saved["optimizer"], begin["optimizer"], f"{name}: optimizer")
            log = Path(f"{prefix}-log-0.txt").read_text()
            before = layouts[index - 1]
            assert (f"Resuming checkpoint ckpt-{2 * index}, written at {before[2]} "
                    f"({before[0]} process{'es' if before[0] > 1 else ''}), at {name} "
                    f"({nproc}): the model and optimizer are resharded from their shards "
                    "(DCP)") in log, log
        saved = end
        if after_each is not None:
            after_each(name, end)
    return begin, saved


@pytest.mark.slow
@pytest.mark.distributed
def test_tensor_parallel_and_fsdp2_by_tensor_parallel_follow_one_process(tmp_path):
    """The same model, data order and global batch: one process; the layers split over 2 ranks
    (tp=2); and 4 ranks of 2 data shards by 2 (dp_shard=2 x tp=2, the tensor-parallel weights
    then sharded by FSDP2 too). Clipping binds at every step, its norm taken over every shard
    and mesh dimension."""
    settings = [*GPT, "trainer.train_steps=6", "trainer.steps_per_loop=1"]
    one = tmp_path / "one"
    cadence_train(1, "gpt", one, settings, tmp_path)
    reference = curves(one)
    assert len(reference[0]) == 6 and min(reference[1]) > 1.0  # clipping at 1.0 binds
    for nproc, layout in ((2, ["runtime.parallelism.tp=2"]),
                          (4, ["runtime.parallelism.dp_shard=2", "runtime.parallelism.tp=2"])):
        run_dir = tmp_path / f"tp-{nproc}"
        result = cadence_train(nproc, "gpt", run_dir, [*settings, *layout], tmp_path)
        losses, norms = curves(run_dir)
        assert losses == pytest.approx(reference[0], rel=1e-5), (nproc, losses)
        assert norms == pytest.approx(reference[1], rel=1e-5), (nproc, norms)
        assert "tensor parallel over 2 ranks (wte Rowwise, blocks.*.attn.q_proj Colwise" in \
            result.stderr
        records = [json.loads(line) for line in
                   (run_dir / "train" / "metrics.jsonl").read_text().splitlines()]
        # examples per second count the data shards: 12 examples a step, however many ranks
        assert records[-1]["examples_per_second"] == pytest.approx(
            12 * records[-1]["steps_per_second"], rel=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_checkpoint_moves_between_layouts_with_its_weights_equal(tmp_path):
    """Written at dp_shard=4, resumed at dp_shard=2 x tp=2, then at tp=2 x dp_replicate=2
    (HSDP over replicas of shards of one), then in one process: where each layout begins, the
    whole model and optimizer, gathered from its shards, are bit for bit those the layout before
    saved; the resume line names both layouts."""
    run_dir = tmp_path / "run"
    settings = [*GPT, "trainer.steps_per_loop=2", "trainer.checkpoint_interval=2"]
    layouts = [
        (4, ["runtime.parallelism.dp_shard=4"], "dp_shard=4"),
        (4, ["runtime.parallelism.dp_shard=2", "runtime.parallelism.tp=2"],
         "dp_shard=2 x tp=2"),
        (4, ["runtime.parallelism.dp_replicate=2", "runtime.parallelism.dp_shard=1",
             "runtime.parallelism.tp=2"], "dp_replicate=2 x tp=2"),
        (1, ["runtime.strategy=fsdp2"], "one process"),
    ]

    def export_at_dp_shard_2_x_tp_2(name, end):  # cadence export gathers its shards, whole
        if name == "dp_shard=2 x tp=2":
            run([sys.executable, "-m", "cadence", "export", str(run_dir), "--checkpoint",
                 str(run_dir / "checkpoints" / "ckpt-4"), "--out", str(tmp_path / "export")],
                cwd=tmp_path)
            from safetensors.torch import load_file

            exported = load_file(str(tmp_path / "export" / "model.safetensors"))
            assert_same_state(end["model"], exported, "export")

    _, saved = move_between_layouts(tmp_path, run_dir, settings, layouts,
                                    after_each=export_at_dp_shard_2_x_tp_2)
    assert all(torch.isfinite(tensor).all() for tensor in saved["model"].values())


@pytest.mark.slow
@pytest.mark.distributed
def test_a_sigkill_then_the_same_command_at_tp2_ends_bitwise_as_an_uninterrupted_run(tmp_path):
    """Tensor parallel over 2 ranks, checkpointed every 2 steps: both ranks SIGKILLed once the
    checkpoint of step 2 is committed, the same command run again resumes it and ends, bit for
    bit, where a run never interrupted ends."""
    settings = [*GPT, "runtime.parallelism.tp=2", "trainer.steps_per_loop=1",
                "trainer.checkpoint_interval=2"]
    job(2, "gpt", tmp_path / "straight", 30, tmp_path / "straight", settings)
    run_dir = tmp_path / "killed"
    command = [*torchrun_command(2), str(JOB), "gpt", str(run_dir), "30",
               str(tmp_path / "first"), *settings]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "ckpt-2" / "manifest.json").exists():
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint at step 2"
        time.sleep(0.05)
    kill_tree(process)  # the launcher and both ranks (torchrun starts each in a session of its own)
    job(2, "gpt", run_dir, 30, tmp_path / "again", settings)
    resumed = torch.load(tmp_path / "again-begin.pt", weights_only=True)
    assert 2 <= resumed["step"] < 30  # the newest checkpoint committed before the kill
    assert_same_state(torch.load(tmp_path / "straight-end.pt", weights_only=True)["model"],
                      torch.load(tmp_path / "again-end.pt", weights_only=True)["model"],
                      "model")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_transformers_llama_at_tp2_trains_as_one_process_and_its_export_opens(tmp_path):
    """LlamaForCausalLM (tied embedding and head, grouped query attention) split by the plan its
    config declares: its loss is one process's, its best export a folder ``from_pretrained``
    opens with the weights it trained."""
    user_job = Path(__file__).parent / "user_model_job.py"
    out_one, out_tp = tmp_path / "one", tmp_path / "tp"
    out_one.mkdir()
    out_tp.mkdir()
    run([sys.executable, str(user_job), str(out_one), "task:hub_llama:auto"], cwd=tmp_path)
    run([*torchrun_command(2), str(user_job), str(out_tp),
         "task:hub_llama:auto:runtime.parallelism.tp=2"], cwd=tmp_path)
    log = (out_tp / "log-0.txt").read_text()
    assert "model.layers.*.self_attn.q_proj Colwise" in log and "lm_head Colwise" in log, log

    def losses(out):
        return [json.loads(line)["training_loss"] for line in
                (out / "hub_llama-auto" / "train" / "metrics.jsonl").read_text().splitlines()]

    assert losses(out_tp) == pytest.approx(losses(out_one), rel=1e-5)
    from transformers import AutoModelForCausalLM

    best = json.loads((out_tp / "hub_llama-auto" / "best" / "info.json").read_text())
    folder = out_tp / "hub_llama-auto" / "best" / best["exports"][0]["path"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied


def refused(tmp_path, settings, nproc=None, env=None):
    """``cadence train`` of the gpt experiment that must be refused: its one error line (the
    last of rank 0's, under torchrun), after asserting exit status 2 and an untouched run."""
    run_dir = tmp_path / "refused"
    launcher = [sys.executable] if nproc is None else torchrun_command(nproc)
    command = [*launcher, "-m", "cadence", "train", "-e", "gpt", "-m", str(run_dir)]
    for setting in [*GPT, *settings]:
        command += ["--set", setting]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert done.returncode != 0, done.stdout
    assert not run_dir.exists() or not any(run_dir.rglob("*")), sorted(run_dir.rglob("*"))
    lines = [line for line in done.stderr.splitlines() if line.startswith("cadence: error:")]
    assert lines, done.stderr[-3000:]
    return lines[0]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_layout_that_cannot_work_is_one_line_before_anything_is_written(tmp_path):
    """Degrees whose product is not the world size, tensor parallelism with DDP -- refused as
    the job starts, before the ranks meet (a process told it is rank 0 of 4 by torchrun's
    variables) -- and a model whose heads do not split over tp, refused before training."""
    four = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1"}
    line = refused(tmp_path, ["runtime.parallelism.tp=3"], env=four)
    assert "leaves no whole dp_shard for 4 processes" in line, line
    line = refused(tmp_path, ["runtime.parallelism.tp=2", "runtime.strategy=ddp"], env=four)
    assert "tp=2 with runtime.strategy=ddp: DDP holds a whole replica" in line, line
    line = refused(tmp_path, ["runtime.parallelism.tp=2", "task.model.n_head=3",
                              "task.model.n_embd=48"], nproc=2)
    assert "runtime.parallelism.tp=2: GPT's n_head=3 is not a multiple of tp=2" in line, line
