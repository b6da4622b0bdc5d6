import io
import re

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


def renders(stream):
    """Every state the bar was drawn in, oldest first."""
    return [part.strip() for part in stream.getvalue().split("\r") if part.strip()]


def count(line):
    """The "n/total" a drawn bar shows, as n."""
    return int(re.search(r"\| *(\d+)/\d+ ", line).group(1))


def bar_to(stream, monkeypatch):
    from tqdm import auto

    monkeypatch.setattr(auto, "tqdm", lambda **kw: __import__("tqdm").tqdm(file=stream, **kw))


class Recording(ProgressBar):
    """Remembers what was on screen when each loop ended."""

    def __init__(self, stream, **kwargs):
        super().__init__(enabled=True, **kwargs)
        self.stream, self.at_loop_end = stream, []

    def on_loop_end(self, state, logs):
        super().on_loop_end(state, logs)
        self.at_loop_end.append(renders(self.stream)[-1])


def test_after_each_loop_the_bar_shows_that_loops_step_beside_that_loops_logs(monkeypatch):
    stream = io.StringIO()
    bar_to(stream, monkeypatch)
    bar = Recording(stream)
    Controller(trainer=CountingTrainer(), steps_per_loop=10, callbacks=[bar]).train(30)
    # CountingTrainer's loss is 1 / step: each loop's own value, drawn with its own count.
    assert [count(line) for line in bar.at_loop_end] == [10, 20, 30]
    assert ["loss=0.1" in bar.at_loop_end[0], "loss=0.05" in bar.at_loop_end[1],
            "loss=0.0333" in bar.at_loop_end[2]] == [True, True, True]


class SlowSteps:
    """A trainer whose steps take time and count one by one, like a real one."""

    def __init__(self, seconds_per_step):
        self.global_step, self.seconds = 0, seconds_per_step

    def train(self, num_steps):
        import time

        for _ in range(num_steps):
            time.sleep(self.seconds)
            self.global_step += 1
        return {"loss": 1.0}


def test_the_count_moves_during_the_first_loop_and_old_logs_say_their_step(monkeypatch):
    stream = io.StringIO()
    bar_to(stream, monkeypatch)
    bar = ProgressBar(enabled=True, refresh_interval=0.02)
    Controller(trainer=SlowSteps(0.01), steps_per_loop=20, callbacks=[bar]).train(40)
    counts = [count(line) for line in renders(stream)]
    assert any(0 < count < 20 for count in counts)  # moving before the first loop ended
    assert any(20 < count < 40 for count in counts)
    during_second = [line for line in renders(stream) if 20 < count(line) < 40]
    assert during_second and all("(at step 20)" in line for line in during_second)
    assert bar._ticker is None  # stopped with training
