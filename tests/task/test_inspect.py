"""`cadence inspect`: what a checkpoint holds, from its headers; nothing in it is executed."""

import torch
from torch import nn

import cadence
from cadence.engine.inspection import describe_checkpoint
from cadence.task.cli import main


def test_inspect_lists_the_step_files_tensors_values_and_config_of_a_runs_newest_checkpoint(
        capsys, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "-m", str(run), "--no-progress", "--set", "trainer.train_steps=4",
                 "--set", "trainer.steps_per_loop=2", "--set", "task.model.hidden_sizes=[8]"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(run), "--verify"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"checkpoint {run / 'checkpoints' / 'ckpt-4'}: step 4, 1 process")
    assert "every one matches its SHA-256" in lines[1]
    assert "    state.model.0.weight  F32  [8, 64]  2.0 KB" in lines  # digits: 64 pixels in
    assert any(line.startswith("    state.optimizer.state.0.exp_avg  F32  [8, 64]")
               for line in lines)
    assert "    state.train_data.batches = 4" in lines  # a value of the data position
    assert f"config ({run / 'params.yaml'}):" in lines and "    train_steps: 4" in lines


def test_inspect_lists_the_tensors_of_a_sharded_checkpoint_from_its_metadata(tmp_path):
    """A checkpoint of a sharded model holds its tensors in DCP's files; their names, dtypes
    and shapes come from the .metadata, read with the restricted unpickler."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    # One process: an in-memory store, no port (a fixed one collided with a parallel run's).
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        cadence.CheckpointManager({"model": model, "optimizer": optimizer},
                                  tmp_path / "checkpoints").save(1)
    finally:
        dist.destroy_process_group()
    lines = describe_checkpoint(tmp_path / "checkpoints" / "ckpt-1", verify=True)
    assert any(line.startswith("  sharded/ (DCP, 1 shard files):") for line in lines), lines
    assert "    model.0.weight  float32  [6, 4]  96 B" in lines
    assert any(line.startswith("    optimizer.state.1.bias.exp_avg  float32  [2]")
               for line in lines), lines


def test_inspect_of_a_folder_without_checkpoints_is_one_line_and_exit_status_2(capsys,
                                                                                tmp_path):
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cadence: error: ") and "holds no complete one" in err
    assert len(err.splitlines()) == 1
