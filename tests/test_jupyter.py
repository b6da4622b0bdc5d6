"""Training in a real Jupyter kernel (nbclient runs the notebook): the loop lines and the
progress bar show without any logging setup, and Ctrl-C (the kernel's interrupt) ends the cell
with a `KeyboardInterrupt` once a checkpoint is saved -- never ``SystemExit``."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.slow

SETUP = """
import cadence
from cadence.task.config_files import load_config
from cadence.task.train_lib import run_experiment

class Started(cadence.Callback):
    def on_loop_end(self, state, logs):
        open("started", "w").close()

def config(steps):
    return load_config("digits", overrides=[
        f"trainer.train_steps={steps}", "trainer.steps_per_loop=10",
        "trainer.checkpoint_interval=1000000", "trainer.validation_interval=10000000",
        "task.model.hidden_sizes=[16]"])
"""


def notebook(*cells: str):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])


def client(nb, path: Path):
    return nbclient.NotebookClient(nb, timeout=240, kernel_name="python3", allow_errors=True,
                                   resources={"metadata": {"path": str(path)}})


def text(cell, name: str) -> str:
    return "".join(o.get("text", "") for o in cell.outputs
                   if o.output_type == "stream" and o.name == name)


def test_a_notebook_shows_the_loop_lines_and_a_progress_bar_and_trains_to_the_end(tmp_path):
    nb = notebook(SETUP, 'model, _ = run_experiment(config(30), "train", "run")\n'
                         'print("finished at", sorted(p.name for p in '
                         '__import__("pathlib").Path("run/checkpoints").iterdir()))')
    client(nb, tmp_path).execute()
    cell = nb.cells[1]
    assert not [o for o in cell.outputs if o.output_type == "error"], cell.outputs
    stderr = text(cell, "stderr")
    # The loop lines, without logging.basicConfig: cadence's own handler in a kernel.
    assert [f"train | step: {s} |" in stderr for s in (10, 20, 30)] == [True] * 3, stderr
    assert stderr.count("train | step: 10 |") == 1  # once, not twice
    assert "30/30" in stderr  # tqdm.auto's bar (text without ipywidgets)
    assert "finished at ['ckpt-30']" in text(cell, "stdout")


def test_a_notebook_with_logging_configured_shows_each_line_once(tmp_path):
    nb = notebook("import logging, sys\n"
                  "logging.basicConfig(level=logging.INFO, stream=sys.stdout, "
                  "format='user: %(message)s')\n" + SETUP,
                  'run_experiment(config(10), "train", "run"); None')
    client(nb, tmp_path).execute()
    out, err = text(nb.cells[1], "stdout"), text(nb.cells[1], "stderr")
    assert out.count("user: train | step: 10 |") == 1, out
    assert "train | step: 10" not in err  # the user's handler shows it, cadence's does not


def test_ctrl_c_in_a_notebook_saves_then_raises_keyboard_interrupt(tmp_path):
    nb = notebook(SETUP, 'run_experiment(config(100000), "train", "run", '
                         'callbacks=[Started()])')
    runner = client(nb, tmp_path)
    with runner.setup_kernel():
        runner.execute_cell(nb.cells[0], 0)

        def interrupt_once_training() -> None:
            deadline = time.monotonic() + 120
            while not (tmp_path / "started").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            asyncio.run(runner.km.interrupt_kernel())  # nbclient's manager is async

        interrupter = threading.Thread(target=interrupt_once_training)
        interrupter.start()
        runner.execute_cell(nb.cells[1], 1)
        interrupter.join()
    errors = [o for o in nb.cells[1].outputs if o.output_type == "error"]
    assert [e.ename for e in errors] == ["KeyboardInterrupt"], nb.cells[1].outputs
    assert "saved" in errors[0].evalue and "SystemExit" not in str(nb.cells[1].outputs)
    saved = sorted((tmp_path / "run" / "checkpoints").glob("ckpt-*"))
    assert saved and saved[0].name in errors[0].evalue
    assert 0 < int(saved[-1].name.split("-")[1]) < 100000
