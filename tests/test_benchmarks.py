"""The benchmark suite keeps working (a smoke run: tiny sizes, one round; figures meaningless)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
@pytest.mark.timeout(900)  # above the subprocess's own 600 s: its error is the one reported
def test_the_benchmark_suite_runs_every_variant_and_writes_its_report(tmp_path):
    out = tmp_path / "benchmarks.md"  # with a section run.py does not write, which it keeps
    out.write_text("# Benchmarks\n\n## 1. Overhead-bound MLP\n\nold figures\n\n"
                   "## 9. Pipeline bubble\n\n| pp | kept |\n\nWhere the time goes ...\n")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke",
                             "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = out.read_text()
    for variant in ("raw_loop", "cadence_controller", "cadence_trainer", "cadence_trainer_accuracy",
                    "cadence_train_loop", "cadence_tensorpack"):
        assert f"| {variant} |" in text and f"| {variant} | failed" not in text
    for kind in ("cadence async save", "cadence sync save", "(floor)"):
        assert kind in text
    assert "| `cadence --help` |" in text
    assert "| Task Trainer + Controller |" in text and "| DataFlow.threaded(4) |" in text
    gpu = text[text.index("## 6. GPU"):]  # workload 6: on a GPU, or a few variants on the CPU
    assert "### mlp" in gpu and "### lm" in gpu and "### host syncs" in gpu
    assert "| raw |" in gpu and "| cadence_trainer |" in gpu
    if not torch.cuda.is_available():
        assert "No GPU here" in gpu
    gpt = text[text.index("## 7. GPT"):]  # workload 7: the hand-written loop and the Trainer
    for variant in ("raw fp32 eager", "trainer fp32 eager", "raw bf16 eager",
                    "trainer bf16 eager"):
        assert f"| {variant} |" in gpt and f"| {variant} | failed" not in gpt
    assert "the Trainer's extra: " in gpt
    loader = text[text.index("## 8. Token loader"):]  # workload 8: the token loader alone
    for variant in ("windows", "packed", "mixture", "mixture packed"):
        assert f"| {variant} | " in loader
    assert "the timeline's input wait is" in loader
    assert "old figures" not in text and "## 9. Pipeline bubble\n\n| pp | kept |\n" in text
    assert text.index("## 9. Pipeline bubble") > text.index("## 8. Token loader")


@pytest.mark.slow
def test_the_paired_benchmark_times_every_front_end_against_the_raw_loop_in_one_process(
        tmp_path):
    out = tmp_path / "paired.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "paired.py"), "--smoke",
                             "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| raw_loop |" in result.stdout and "| 1.000x | 1.000x |" in result.stdout
    figures = json.loads(out.read_text())["us_per_step"]
    assert list(figures) == ["raw_loop", "cadence_controller", "cadence_trainer",
                             "cadence_tensorpack", "cadence_train_loop"]
    assert all(len(us) == 1 and us[0] > 0 for us in figures.values())


def test_the_ablation_times_a_front_end_without_each_of_its_defaults(tmp_path):
    out = tmp_path / "ablation.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "paired.py"), "--smoke",
                             "--ablation", "cadence_controller", "--out", str(out)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    defaults = ["loss", "summaries", "checkpoints", "progress", "controller"]
    assert list(json.loads(out.read_text())["us_per_step"]) == (
        ["raw_loop", "cadence_controller"] + [f"cadence_controller-{d}" for d in defaults]
        + ["cadence_controller-" + "+".join(defaults)])
    assert "| over raw, us/step |" in result.stdout



def test_the_ablation_refuses_a_default_the_variant_does_not_declare():
    for names, declared in (("raw_loop,cadence_controller-foo",
                             "loss, summaries, checkpoints, progress, controller"),
                            ("raw_loop,cadence_tensorpack-progress", "nothing")):
        result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "paired.py"),
                                 "--smoke", "--variants", names],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and f"can leave out only {declared}" in result.stderr

LEFT_OUT = """
import os, sys, tempfile
from pathlib import Path
os.environ["CADENCE_BENCH_SAMPLES"] = "320"
sys.path.insert(0, sys.argv[1])
import workload
x, y = workload.make_data()
for without in [(), ("checkpoints",), ("summaries",), ("timeline",), ("controller",)]:
    with tempfile.TemporaryDirectory() as workdir:
        train, loss = workload.load_variant("cadence_trainer").build(x, y, workdir,
                                                                     without=without)
        train()
        print(without, sorted(p.name for p in Path(workdir).iterdir()), loss())
"""


def test_a_default_left_out_of_the_trainer_variant_writes_nothing(tmp_path):
    result = subprocess.run([sys.executable, "-c", LEFT_OUT, str(ROOT / "benchmarks")],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = {line.split("]")[0] + "]" for line in result.stdout.splitlines()}
    assert written == {"() ['ckpt', 'timeline', 'train']", "('checkpoints',) ['timeline', 'train']",
                       "('summaries',) ['ckpt', 'timeline']", "('timeline',) ['ckpt', 'train']",
                       "('controller',) []"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_metrics_benchmark_runs_and_reports_both_accuracies():
    pytest.importorskip("torchmetrics")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "metrics.py"), "--smoke"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for row in ("| 32 x 10 | cadence Accuracy |", "| 32 x 10 | torchmetrics micro",
                "| cadence_trainer_accuracy |", "| cadence_trainer_torchmetrics |"):
        assert row in result.stdout, row


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_the_checkpoint_scale_benchmark_measures_save_commit_and_restore_per_world_size():
    """A smoke run at 2 ranks, tiny sizes: the table is made and its counters count (the
    figures in docs/scale.md come from 2 to 16 ranks; what each rank reads is tested by
    tests/test_real_models.py)."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "checkpoint_scale.py"),
                             "--ranks", "2", "--layers", "2", "--width", "64"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:]
            for line in result.stdout.splitlines() if line.startswith("| ") and "N=" not in line}
    assert "rank 0's commit, ms" in rows and "bytes read at restore, KB (most, any rank)" in rows
    assert float(rows["collectives per rank, restore (median)"][0]) > 0  # counted, not zero
    assert float(rows["bytes read at restore, KB (most, any rank)"][0]) > 0


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_the_pipeline_bubble_benchmark_times_each_schedule_and_counts_the_activations_held(
        tmp_path):
    """A smoke run at pp=2 (GPipe and 1F1B, 1 and 4 microbatches, 1 ms blocks): the table is
    made, the refusal is a row, and the activations held are each schedule's -- GPipe all 4
    microbatches on both ranks, 1F1B 2 on the first and 1 on the last (the times are
    meaningless at this size; docs/benchmarks.md has a real run's)."""
    out = tmp_path / "bubble.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pipeline_bubble.py"),
                             "--smoke", "--out", str(out)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert ("| 2 | 1f1b | 1 | refused: Number of microbatches (1) must be greater than or equal "
            "to the number of stages (2). |") in result.stdout
    results = json.loads(out.read_text())["results"]
    figures = {(r["schedule"], r["microbatches"]): r for r in results}
    assert set(figures) == {("gpipe", 1), ("gpipe", 4), ("1f1b", 1), ("1f1b", 4)}
    assert figures["gpipe", 4]["held_peak"] == [4, 4]
    assert figures["1f1b", 4]["held_peak"] == [2, 1]
    for key in (("gpipe", 1), ("gpipe", 4), ("1f1b", 4)):
        assert figures[key]["held_after"] == [0, 0]  # every backward ran
        assert figures[key]["forwards_per_step"] == [key[1]] * 2  # each microbatch, once
        assert len(figures[key]["step_s"]) == 2 and figures[key]["median_s"] > 0
        assert 0 < figures[key]["theory"] < 1
