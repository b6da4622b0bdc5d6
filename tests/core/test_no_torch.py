"""cadence.core is the engine that needs no tensors: it must work with torch blocked."""

import subprocess
import sys

from torch_blocker import BLOCK_TORCH


def test_controller_trains_and_writes_summaries_without_torch(tmp_path):
    code = BLOCK_TORCH + f"""
from cadence.core import Controller
class Trainer:
    global_step = 0
    def train(self, n):
        self.global_step += n
        return {{'loss': 1.0}}
c = Controller(trainer=Trainer(), steps_per_loop=5, summary_dir={str(tmp_path)!r})
c.train(10)
c.close()
print(c.global_step, 'torch' in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["10", "False"]
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2
