import pytest

from cadence.core.intervals import (
    Interval,
    check_int,
    check_interval,
    is_int,
    steps_until_boundary,
)


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


@pytest.mark.parametrize(("value", "minimum", "none_ok", "kind"), [
    (0, 1, False, "a positive int"), (-1, 0, True, "a non-negative int or None"),
    (True, 1, False, "a positive int"), (2.0, 1, False, "a positive int"),
    (None, 1, False, "a positive int"), (1, 2, False, "an int >= 2"),
])
def test_check_int_refuses_with_the_owner_the_argument_the_value_and_the_fix(value, minimum,
                                                                           none_ok, kind):
    expected = f"Loop: `every` (got {value!r}) must be {kind}. Pass e.g. every=5."
    with pytest.raises(ValueError) as error:
        check_int("Loop", "every", value, "Pass e.g. every=5.", minimum=minimum, none_ok=none_ok)
    assert str(error.value) == expected


def test_check_int_returns_plain_ints_and_none_where_allowed():
    import numpy as np

    assert check_int("Loop", "every", np.int64(3), "") == 3
    assert type(check_int("Loop", "every", np.int64(3), "")) is int
    assert check_int("Loop", "every", 0, "", minimum=0) == 0
    assert check_int("Loop", "every", None, "", none_ok=True) is None


def test_is_int_is_the_one_integer_test_ints_and_numpy_ints_not_bools_floats_or_strings():
    import numpy as np

    assert [is_int(v) for v in (3, -1, np.int64(3))] == [True, True, True]
    assert [is_int(v) for v in (True, 3.0, "3", None)] == [False, False, False, False]
