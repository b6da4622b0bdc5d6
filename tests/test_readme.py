"""The README's twenty-line example runs as written."""

import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_readme_example_trains_and_resumes(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["trainer"].global_step == 200
    checkpoints = {p.name for p in (tmp_path / "runs/demo/ckpt").iterdir()}
    assert checkpoints == {"ckpt-50", "ckpt-100", "ckpt-150", "ckpt-200"}
    again: dict = {}
    exec(compile(code, "README.md", "exec"), again)  # the same program resumes: nothing to train
    assert again["trainer"].global_step == 200
    assert (tmp_path / "runs/demo/train/metrics.jsonl").read_text().count("\n") == 8
