"""`Profiler` on ``torch.profiler.schedule``: a trace per cycle through TensorBoard's trace
handler, a range of steps cut short by the end of training, and arguments that profile nothing."""

import json
import re

import pytest
from fakes import TinyClassifier, make_loader

import cadence
from cadence.callbacks import Profiler


def profiled_steps(path):
    events = json.loads(path.read_text())["traceEvents"]
    return sorted(int(e["name"].split("#")[1]) for e in events
                  if e.get("name", "").startswith("ProfilerStep#"))


def test_a_schedule_writes_a_tensorboard_trace_per_cycle(tmp_path):
    profiler = Profiler(wait=1, warmup=1, active=2, repeat=2, directory=tmp_path)
    runner = TinyClassifier(make_loader())
    cadence.Controller(trainer=runner, steps_per_loop=4, callbacks=[profiler]).train(12)
    assert len(profiler.trace_paths) == 2 and profiler.trace_path == profiler.trace_paths[-1]
    assert all(re.fullmatch(r"rank0\.\d+\.pt\.trace\.json", p.name)
               for p in profiler.trace_paths)
    assert [profiled_steps(p) for p in profiler.trace_paths] == [[2, 3], [6, 7]]


def test_a_range_that_training_ends_inside_writes_what_it_recorded(tmp_path):
    profiler = Profiler(2, 100, directory=tmp_path)
    runner = TinyClassifier(make_loader())
    cadence.Controller(trainer=runner, steps_per_loop=3, callbacks=[profiler]).train(6)
    assert profiler.trace_paths == [tmp_path / "trace-2-6.json"]
    # Global steps 3 to 6 (profiler steps from 0; what runs after the last step, to the end of
    # training, is the unfinished ProfilerStep#6).
    assert profiled_steps(profiler.trace_path)[:4] == [2, 3, 4, 5]


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"start_step": 1, "end_step": 4, "active": 2},
     r"pass a range of steps .* or a schedule .*not both"),
    ({}, r"pass the range of steps to profile, e\.g\. Profiler\(start_step=10, end_step=20\)"),
    ({"start_step": 3}, r"pass the range of steps to profile"),
    ({"active": 0}, r"`active` \(got 0\) must be a positive int\. Pass e\.g\. Profiler\(wait=1"),
    ({"active": 2, "wait": -1}, r"`wait` \(got -1\) must be a non-negative int"),
    ({"active": 2, "repeat": 1.5}, r"`repeat` \(got 1\.5\) must be a non-negative int"),
])
def test_a_profiler_that_would_profile_nothing_is_refused(kwargs, says):
    with pytest.raises(ValueError, match=rf"^Profiler: {says}"):
        Profiler(**kwargs)
