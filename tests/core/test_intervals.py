import pytest

from cadence.core.intervals import Interval, check_interval, steps_until_boundary


@pytest.mark.parametrize(
    ("every", "last", "step", "crossed"),
    [
        (10, 0, 9, False),
        (10, 0, 10, True),
        (10, 9, 12, True),   # a loop of 3 from 9 crossed 10
        (10, 10, 19, False),
        (10, 10, 25, True),
        (None, 0, 1000, False),
    ],
)
def test_crossed_means_a_multiple_lies_in_the_half_open_range(every, last, step, crossed):
    assert Interval(every, last).crossed(step) is crossed


def test_steps_until_boundary_stops_at_the_nearest_boundary_or_target():
    assert steps_until_boundary(0, 100, Interval(30), Interval(45)) == 30
    assert steps_until_boundary(30, 100, Interval(30), Interval(45)) == 15
    assert steps_until_boundary(90, 100, Interval(30)) == 10  # the target comes first
    assert steps_until_boundary(0, 7, Interval(None)) == 7


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (-5, ValueError),
                                              (1.5, TypeError), (True, TypeError)])
def test_check_interval_rejects_bad_values(value, error):
    with pytest.raises(error, match="interval"):
        check_interval("interval", value)
