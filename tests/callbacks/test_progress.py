import io

from fakes import CountingTrainer

import cadence.callbacks.progress as progress
from cadence.callbacks.progress import ProgressBar
from cadence.core import Controller


def test_progress_bar_counts_steps_to_the_target_and_shows_logs(monkeypatch):
    stream = io.StringIO()
    from tqdm import auto

    monkeypatch.setattr(auto, "tqdm", lambda **kw: __import__("tqdm").tqdm(file=stream, **kw))
    bar = ProgressBar(enabled=True)
    controller = Controller(trainer=CountingTrainer(), steps_per_loop=10, callbacks=[bar])
    controller.train(30)
    text = stream.getvalue()
    assert "30/30" in text and "loss=" in text
    assert bar._bar is None  # closed at the end of training


def test_progress_bar_is_silent_off_a_terminal(monkeypatch):
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    bar = ProgressBar()
    Controller(trainer=CountingTrainer(), steps_per_loop=10, callbacks=[bar]).train(10)
    assert bar._bar is None and not bar._active()
