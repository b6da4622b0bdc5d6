"""Throughput in the logs: tokens per second (the job's and per device), TFLOPS per device and
MFU against the device's peak -- none on a device whose peak is not known -- for a task that
says what an example costs."""

import json

import pytest
import torch

import cadence.engine.throughput as throughput
from cadence.engine.throughput import Throughput, peak_flops
from cadence.task.config_files import load_config
from cadence.task.train_lib import run_experiment


def test_the_peak_is_the_datasheet_s_by_name_and_precision_and_none_for_a_cpu():
    assert peak_flops("CUDA (NVIDIA H100 80GB HBM3)", "bf16") == 989.5e12
    assert peak_flops("CUDA (NVIDIA H100 PCIe)", "bf16") == 756e12  # not the SXM's
    assert peak_flops("CUDA (NVIDIA H200)", "fp16") == 989.5e12
    assert peak_flops("CUDA (NVIDIA A100-SXM4-80GB)", "fp32") == 19.5e12
    assert peak_flops("CPU", "bf16") is None


def test_a_loop_s_rates_from_its_step_rate(monkeypatch):
    """8 devices at 2 steps a second of 16 x 1,024 tokens, 1 GFLOP a token, on an H100 in
    bf16: 32,768 tokens/s, 4,096 a device, 4.096 TFLOPS a device, 0.414% of 989.5."""
    monkeypatch.setattr(throughput, "device_name", lambda device: "CUDA (NVIDIA H100)")
    rates = Throughput(16 * 1024, 1e9, torch.device("cpu"), 8, "bf16").loop_rates(2.0)
    assert rates == pytest.approx({"tokens_per_second": 32768.0,
                                   "tokens_per_second_per_device": 4096.0,
                                   "tflops_per_device": 4.096,
                                   "mfu_percent": 100 * 4.096 / 989.5})
    cpu = Throughput(1024, None, torch.device("cpu"), 1).loop_rates(1.0)
    assert cpu == {"tokens_per_second": 1024.0, "tokens_per_second_per_device": 1024.0}


def test_the_gpt_experiment_logs_its_tokens_and_tflops_and_no_mfu_on_a_cpu(tmp_path):
    config = load_config("gpt", overrides=[
        "task.model.n_layer=1", "task.model.n_embd=32", "task.model.n_head=2",
        "task.model.block_size=16", "task.sequence_length=16", "task.max_bytes=20000",
        "task.train_data.global_batch_size=4", "trainer.train_steps=4",
        "trainer.steps_per_loop=2", "trainer.validation_interval=4",
        "trainer.validation_steps=1", "runtime.device=cpu"])
    model, _ = run_experiment(config, "train", tmp_path)
    records = [json.loads(line) for line in
               (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["tokens_per_second"] == pytest.approx(last["steps_per_second"] * 4 * 16)
    assert last["tokens_per_second_per_device"] == last["tokens_per_second"]
    flops = model.flops_per_token(16)  # 6 N + 12 L H Q T
    assert flops == 6 * model.num_parameters() + 12 * 1 * 32 * 16
    assert last["tflops_per_device"] == pytest.approx(last["tokens_per_second"] * flops / 1e12)
    assert "mfu_percent" not in last and "peak_memory_gib" not in last
