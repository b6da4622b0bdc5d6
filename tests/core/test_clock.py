"""The epoch rules, once, on the `RunClock` every front-end counts on (cadence.core.clock), and
the one step protocol every front-end's step loop is written with.

These tests import nothing but cadence.core: `test_the_rules_hold_with_torch_blocked` runs this
file again in a process where importing torch fails.
"""

from pathlib import Path

from torch_blocker import assert_passes_without_torch

from cadence.core.callbacks import Callback, CallbackList, RunState
from cadence.core.clock import RunClock


class Recorder(Callback):
    """Records each hook with the (epoch, global_step) the state shows."""

    def __init__(self, stop_at=None):
        self.events = []
        self.stop_at = stop_at

    def _note(self, hook, state):
        self.events.append((hook, state.epoch, state.global_step))

    def on_epoch_begin(self, state):
        self._note("epoch_begin", state)

    def on_step_begin(self, state):
        self._note("step_begin", state)

    def on_epoch_end(self, state):
        self._note("epoch_end", state)

    def on_step_end(self, state):
        self._note("step_end", state)
        if state.global_step == self.stop_at:
            state.request_stop("enough")


def make(steps_per_epoch=None, stop_at=None, **kwargs):
    recorder = Recorder(stop_at)
    clock = RunClock(RunState(), CallbackList([recorder]), steps_per_epoch=steps_per_epoch,
                     **kwargs)
    return clock, recorder


def run_loop(clock, num_steps, pass_length=None, batches=None):
    """A runner's loop, as `StandardTrainer` writes it: `batches` is the data's position in its
    pass (a one-item list, so that passes carry over loops)."""
    batches = batches if batches is not None else [0]
    runs = clock.begin_loop(num_steps)
    while runs and clock.begin_step():
        batches[0] += 1
        last_batch_of_pass = batches[0] == pass_length
        if last_batch_of_pass:
            batches[0] = 0
        runs = clock.end_step(last_batch_of_pass)
    clock.end_loop()


def steps(recorder):
    return [event for event in recorder.events if event[0].startswith("step")]


def test_an_epoch_opens_at_its_first_step_and_its_hooks_see_its_number():
    clock, recorder = make(steps_per_epoch=2)
    run_loop(clock, 1)
    assert recorder.events == [("epoch_begin", 1, 0), ("step_begin", 1, 0), ("step_end", 1, 1)]
    assert clock.progress.epoch_open and not clock.progress.epoch_finished


def test_an_epoch_of_n_steps_that_ends_in_mid_loop_closes_there():
    clock, recorder = make(steps_per_epoch=2)
    run_loop(clock, 3)
    assert [e for e in recorder.events if not e[0].startswith("step")] == [
        ("epoch_begin", 1, 0), ("epoch_end", 1, 2), ("epoch_begin", 2, 2)]
    assert clock.progress.epochs_completed == 1


def test_an_epoch_that_ends_with_the_loop_closes_after_it_once_its_logs_are_there():
    clock, recorder = make(steps_per_epoch=2)
    run_loop(clock, 2)
    assert ("epoch_end", 1, 2) not in recorder.events  # waits for the loop's logs
    assert clock.epoch_end_pending and clock.progress.epoch_finished
    clock.end_pending_epoch()
    assert recorder.events[-1] == ("epoch_end", 1, 2)
    assert not clock.progress.epoch_open
    clock.end_pending_epoch()  # once
    assert recorder.events.count(("epoch_end", 1, 2)) == 1


def test_an_epoch_is_a_pass_over_the_data_when_it_has_no_number_of_steps():
    clock, recorder = make()
    batches = [0]
    run_loop(clock, 4, pass_length=3, batches=batches)
    assert ("epoch_end", 1, 3) in recorder.events and ("epoch_begin", 2, 3) in recorder.events
    assert clock.progress.epoch == 2 and clock.progress.epoch_step == 1


def test_a_stop_that_ends_training_ends_the_epoch_there_once_and_a_later_run_goes_on():
    clock, recorder = make(steps_per_epoch=4, stop_at=3)
    run_loop(clock, 10)
    assert clock.progress.global_step == 3
    assert clock.stopping and clock.epoch_end_pending and not clock.pausing
    clock.end_pending_epoch()
    assert recorder.events[-1] == ("epoch_end", 1, 3)
    assert clock.progress.epoch_finished and clock.progress.epochs_completed == 1

    saved = clock.progress.state_dict()
    resumed, recorder = make(steps_per_epoch=4)
    resumed.progress.load_state_dict(saved)  # as a checkpoint restores it
    run_loop(resumed, 1)
    assert recorder.events[0] == ("epoch_begin", 2, 3)  # the next epoch: not epoch 1's end again
    assert ("epoch_end", 1, 4) not in recorder.events


class Pauser(Recorder):
    """Pauses the run (a signal, a time limit) after step `stop_at`."""

    def on_step_end(self, state):
        self._note("step_end", state)
        if state.global_step == self.stop_at:
            state.request_stop("SIGTERM", pause=True)


def test_a_pause_leaves_the_epoch_unfinished_without_its_end_and_a_new_process_ends_it_once():
    recorder = Pauser(stop_at=3)
    clock = RunClock(RunState(), CallbackList([recorder]), steps_per_epoch=4)
    run_loop(clock, 10)
    assert clock.progress.global_step == 3 and clock.stopping and clock.pausing
    clock.end_pending_epoch()
    assert ("epoch_end", 1, 3) not in recorder.events and not clock.progress.epoch_open
    assert not clock.progress.epoch_finished and clock.progress.epochs_completed == 0

    saved = clock.progress.state_dict()
    resumed, recorder = make(steps_per_epoch=4)
    resumed.progress.load_state_dict(saved)  # as a checkpoint restores it
    assert resumed.steps_to_epoch_end() == 1
    run_loop(resumed, 1)
    assert recorder.events[0] == ("epoch_begin", 1, 3)  # the same epoch, begun again here
    resumed.end_pending_epoch()
    assert recorder.events[-1] == ("epoch_end", 1, 4)  # its end, once, at its true end
    assert resumed.progress.epochs_completed == 1


def test_a_stop_asked_before_a_step_means_the_step_does_not_start():
    clock, _ = make(steps_per_epoch=4)
    clock.state.request_stop("before")
    assert not clock.begin_step()
    assert clock.progress.global_step == 0 and not clock.progress.epoch_open


def test_the_end_of_the_data_ends_training_with_stop_at_end_of_data():
    clock, recorder = make(stop_at_end_of_data=True)
    run_loop(clock, 10, pass_length=3)
    assert clock.progress.global_step == 3
    assert clock.state.stop_reason == "end of training data"
    clock.end_pending_epoch()
    assert recorder.events[-1] == ("epoch_end", 1, 3)
    assert clock.progress.epochs_completed == 1


def test_data_that_runs_out_before_a_step_finishes_a_pass_but_not_an_epoch_of_n_steps():
    by_pass, _ = make()
    by_pass.begin_loop(10)
    assert by_pass.begin_step()
    assert by_pass.data_ran_out() is True  # the pass ends; training goes on
    assert by_pass.progress.epoch_finished and not by_pass.progress.epoch_open
    assert by_pass.progress.global_step == 0 and not by_pass.step_open  # no step counted

    by_steps, _ = make(steps_per_epoch=5)
    by_steps.begin_loop(10)
    by_steps.begin_step()
    assert by_steps.data_ran_out() is True
    assert by_steps.progress.epoch_open  # the data repeats within the epoch


def test_the_end_of_the_data_before_a_step_ends_training_with_stop_at_end_of_data():
    clock, _ = make(stop_at_end_of_data=True)
    clock.begin_loop(10)
    assert clock.begin_step()
    assert clock.data_ran_out() is False
    assert not clock.begin_step()  # the stop it requested: no step begins
    assert clock.state.stop_reason == "end of training data"


def test_a_step_that_raises_does_not_count():
    clock, recorder = make()
    clock.begin_loop(3)
    assert clock.begin_step() and clock.step_open
    assert clock.progress.global_step == 0  # counted when it ends
    clock.abort_step()
    assert not clock.step_open and clock.progress.global_step == 0
    assert clock.progress.state_dict()["global_step"] == 0
    assert "step_end" not in [event[0] for event in recorder.events]


def test_a_loop_ends_after_its_steps_and_zero_steps_run_none():
    clock, recorder = make()
    run_loop(clock, 3)
    assert clock.progress.global_step == 3 and len(steps(recorder)) == 6
    assert clock.begin_loop(0) is False and not clock.begin_step()
    assert clock.progress.global_step == 3


def test_max_step_is_the_clocks_limit():
    clock, _ = make(max_step=2)
    run_loop(clock, 10)
    assert clock.progress.global_step == 2 and clock.limit_reached


def test_a_loop_with_no_steps_left_in_its_epoch_runs_only_the_epochs_hooks():
    clock, recorder = make(steps_per_epoch=2)
    clock.progress.load_state_dict({"global_step": 2, "epoch": 1, "epoch_step": 2,
                                    "epoch_finished": False})
    assert clock.begin_loop(0) is False
    clock.end_pending_epoch()
    assert recorder.events == [("epoch_begin", 1, 2), ("epoch_end", 1, 2)]
    assert clock.progress.epochs_completed == 1


def test_steps_to_the_epochs_end_and_to_a_number_of_epochs():
    clock, _ = make(steps_per_epoch=4)
    assert clock.steps_to_epoch_end() == 4 and clock.steps_to_epochs(3) == 12
    run_loop(clock, 5)
    assert clock.steps_to_epoch_end() == 3 and clock.steps_to_epochs(3) == 7
    assert clock.steps_to_epochs(1) == 0
    by_pass, _ = make()
    assert by_pass.steps_to_epoch_end() is None and by_pass.steps_to_epochs(2) is None
    assert by_pass.max_steps_to_epoch_end(batches_left=0) == 1  # a step takes a batch
    assert by_pass.max_steps_to_epoch_end(batches_left=None) is None


class Agreement:
    """Two ranks, played by one: the other rank asks to stop after `other_stops_at` steps (a
    pause, with `other_pauses`). As `StopAgreement` is asked, an agreed stop is followed by a
    second question: whether any rank's stop is a pause."""

    def __init__(self, clock, other_stops_at, other_pauses=False):
        self.clock, self.other_stops_at = clock, other_stops_at
        self.other_pauses = other_pauses
        self._pause_question = False

    def _other(self):
        return self.clock.progress.global_step >= self.other_stops_at

    def poll(self, local):
        return local or self._other()

    def agree(self, local):
        if self._pause_question:
            self._pause_question = False
            return local or (self._other() and self.other_pauses)
        self._pause_question = answer = local or self._other()
        return answer

    def reset(self):
        pass


def test_across_ranks_a_local_stop_waits_for_the_agreement_and_the_decision_is_its():
    clock, _ = make(steps_per_epoch=10)
    clock.agreement = Agreement(clock, other_stops_at=99)
    clock.state.request_stop("this rank only")
    clock.begin_loop(5)
    assert clock.begin_step()  # not before the ranks agree
    assert not clock.end_step(False)  # they agree after this step
    assert not clock.begin_step()
    assert clock.end_loop() and clock.stopping

    other, _ = make(steps_per_epoch=10)
    other.agreement = Agreement(other, other_stops_at=2)
    run_loop(other, 5)
    assert other.progress.global_step == 2 and other.state.stop_requested
    assert other.state.stop_reason == "a stop was requested on another rank"  # joined
    assert other.stopping and other.epoch_end_pending and not other.pausing


def test_across_ranks_another_rank_s_pause_is_this_rank_s():
    clock, recorder = make(steps_per_epoch=10)
    clock.agreement = Agreement(clock, other_stops_at=2, other_pauses=True)
    run_loop(clock, 5)
    assert clock.progress.global_step == 2 and clock.stopping and clock.pausing
    assert not clock.epoch_end_pending and not clock.progress.epoch_open
    assert all(event[0] != "epoch_end" for event in recorder.events)


def test_agree_to_stop_makes_another_ranks_stop_this_ranks_and_clear_stop_forgets_it():
    clock, _ = make()
    clock.agreement = Agreement(clock, other_stops_at=0)
    assert clock.agree_to_stop() and clock.state.stop_reason == (
        "a stop was requested on another rank")
    clock.clear_stop()
    assert not clock.state.stop_requested
    alone, _ = make()
    assert alone.agree(True) is True and alone.agree(False) is False


def user_epochs(clock, epochs_of_steps, pass_length=None):
    """`TrainLoop`'s loops: the user writes the epoch loop, and each epoch's step loop ends at
    the data's pass end (`pass_length` batches) or a limit."""
    for _ in range(epochs_of_steps):
        if not clock.begin_epoch():
            return
        clock.begin_loop()
        batches = 0
        while clock.begin_step():
            batches += 1
            if not clock.end_step(batches == pass_length):
                break
        clock.end_loop()
        clock.end_epoch()


def test_an_epoch_its_user_writes_opens_and_closes_with_its_body_and_its_pass_ends_its_steps():
    clock, recorder = make()
    user_epochs(clock, 2, pass_length=3)
    assert [e for e in recorder.events if e[0].startswith("epoch")] == [
        ("epoch_begin", 1, 0), ("epoch_end", 1, 3), ("epoch_begin", 2, 3), ("epoch_end", 2, 6)]
    assert clock.progress.epochs_completed == 2


def test_max_epoch_and_max_step_end_the_users_epoch_loop():
    clock, _ = make(max_epoch=2)
    user_epochs(clock, 5, pass_length=2)
    assert clock.progress.epoch == 2 and clock.progress.global_step == 4
    by_step, _ = make(max_step=5)
    user_epochs(by_step, 5, pass_length=2)
    assert by_step.progress.global_step == 5 and by_step.progress.epoch == 3


def test_a_pause_leaves_a_users_epoch_unfinished_unless_its_pass_was_over():
    recorder = Pauser(stop_at=2)
    clock = RunClock(RunState(), CallbackList([recorder]))
    user_epochs(clock, 5, pass_length=3)
    assert clock.progress.epoch == 1 and not clock.progress.epoch_finished  # reopened on resume
    assert ("epoch_end", 1, 2) not in recorder.events
    recorder = Pauser(stop_at=3)
    at_pass_end = RunClock(RunState(), CallbackList([recorder]))
    user_epochs(at_pass_end, 5, pass_length=3)
    assert at_pass_end.progress.epoch == 1 and at_pass_end.progress.epoch_finished
    assert ("epoch_end", 1, 3) in recorder.events


def test_a_stop_that_ends_training_ends_a_users_epoch_there_as_finished():
    clock, recorder = make(stop_at=2)
    user_epochs(clock, 5, pass_length=3)
    assert clock.progress.epoch == 1 and clock.progress.epoch_finished
    assert ("epoch_end", 1, 2) in recorder.events


def test_a_step_whose_body_is_running_counts_as_done_for_a_checkpoint_and_the_state():
    """TrainLoop's step is the body of its user's loop: a checkpoint made there, a print and its
    callbacks all belong to the step running."""
    clock, recorder = make()
    clock.begin_epoch()
    clock.begin_loop()
    assert clock.begin_step()
    assert clock.progress.global_step == 0 and clock.state.global_step == 1
    assert clock.progress.state_dict()["global_step"] == 1
    assert clock.progress.state_dict()["epoch_step"] == 1
    clock.end_step(False)
    assert clock.progress.global_step == 1 and recorder.events[-1] == ("step_end", 1, 1)


def test_a_body_that_breaks_out_of_the_loop_counts_its_step_without_its_end_hooks():
    clock, recorder = make()
    clock.begin_epoch()
    clock.begin_loop()
    clock.begin_step()
    clock.leave_step()
    clock.leave_epoch()
    assert clock.progress.global_step == 1 and not clock.step_open
    assert not clock.progress.epoch_open and not clock.progress.epoch_finished
    assert [e[0] for e in recorder.events] == ["epoch_begin", "step_begin"]


def test_counters_from_elsewhere_go_through_the_clock():
    clock, _ = make()
    clock.set_global_step(40)
    clock.start_at_epoch(3)
    assert clock.state.global_step == 40 and clock.state.epoch == 2


def heal_in_loop(clock, num_steps, heal_at, to_step):
    """A loop whose step number `heal_at` takes a live replica group's counters (its global
    step `to_step`) in the middle of the step, as a heal does; returns each step's end."""
    ends, taken = [], 0
    runs = clock.begin_loop(num_steps)
    while runs and clock.begin_step():
        taken += 1
        if taken == heal_at:
            counters = clock.progress.state_dict()
            clock.adopt({**counters, "global_step": to_step})
        runs = clock.end_step(False)
        ends.append(clock.progress.global_step)
    clock.end_loop()
    return ends


def test_a_heal_that_jumps_keeps_the_loop_ending_at_the_step_it_was_aimed_at():
    clock, _ = make()
    clock.set_global_step(300)
    assert heal_in_loop(clock, 20, heal_at=1, to_step=305) == [*range(306, 321)]
    assert clock.jumped == 5


def test_a_heal_that_jumps_past_the_loops_end_ends_it_after_the_step_in_flight():
    """A group that restored step 300 and joined a live group at step 392, in a loop aimed at
    320 of a run of 400: the loop ends at 393, and the next ones can still end at 400 (they
    ran 412 steps when the loop kept its 20)."""
    clock, _ = make()
    clock.set_global_step(300)
    assert heal_in_loop(clock, 20, heal_at=2, to_step=392) == [301, 393]
    assert clock.jumped == 91


def test_no_module_but_the_clock_writes_a_progress_field():
    """`Progress` has one writer: the clock. Everyone else reads it (a checkpoint restores it
    with ``load_state_dict``)."""
    import re

    package = Path(__file__).parents[2] / "cadence"
    fields = "global_step|epoch|epoch_step|epoch_finished|epoch_open|step_running"
    writes = re.compile(rf"\b(progress|_progress|state\.progress)\.({fields})\s*(\+|-)?=[^=]")
    found = [f"{path.relative_to(package)}:{number}: {line.strip()}"
             for path in package.rglob("*.py") if path.name != "clock.py"
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if writes.search(line)]
    assert found == []
    assert not re.search(r"state\.(global_step|epoch)\s*=[^=]", "\n".join(
        path.read_text() for path in package.rglob("*.py")))


def test_the_rules_hold_with_torch_blocked():
    assert_passes_without_torch(__file__)
