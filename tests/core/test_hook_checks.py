"""`cadence.core.hook_checks`: a hook's result checked at its first call, and never again."""

import copy
import pickle

import pytest

from cadence.core.errors import HookError, HookTypeError
from cadence.core.hook_checks import check_first_call, check_output, describe


class Owner:
    def step(self, value):
        return value


def refuse_negatives(result):
    if result < 0:
        raise HookTypeError(f"Owner.step() returned {result}")


def test_the_first_call_is_checked_and_every_later_one_is_the_method_itself():
    owner, seen = Owner(), []
    check_first_call(owner, "step", seen.append)
    assert "step" in vars(owner)
    assert owner.step(1) == 1
    assert seen == [1]
    assert "step" not in vars(owner)  # no wrapper, no flag left on the way
    assert owner.step.__func__ is Owner.step
    assert owner.step(2) == 2 and owner.step(3) == 3
    assert seen == [1]


def test_a_refused_first_call_raises_and_later_calls_are_not_checked():
    owner = Owner()
    check_first_call(owner, "step", refuse_negatives)
    with pytest.raises(HookTypeError, match=r"Owner\.step\(\) returned -1"):
        owner.step(-1)
    assert owner.step(-2) == -2


def test_an_attribute_of_the_instance_is_checked_and_put_back():
    owner, seen = Owner(), []
    compiled = owner.step = lambda value: value * 2  # e.g. a compiled step kept on the instance
    check_first_call(owner, "step", seen.append)
    assert owner.step(1) == 2 and seen == [2]
    assert vars(owner)["step"] is compiled  # what was there, as it was
    assert owner.step(2) == 4 and seen == [2]


def test_a_wrapper_set_over_the_check_is_kept_and_the_check_runs_once():
    owner, seen = Owner(), []
    check_first_call(owner, "step", seen.append)
    original = owner.step
    owner.step = lambda value: original(value) + 1  # a user's wrapper of the checked method
    assert owner.step(1) == 2 and seen == [1]
    assert owner.step(1) == 2 and seen == [1]  # the user's attribute stays; the check is spent


def test_a_checked_owner_can_be_copied_and_pickled():
    owner = Owner()
    check_first_call(owner, "step", refuse_negatives)
    for other in (copy.deepcopy(owner), pickle.loads(pickle.dumps(owner))):
        with pytest.raises(HookTypeError):
            other.step(-1)
        assert "step" not in vars(other)
    assert "step" in vars(owner)  # the original is not checked yet


class Scalar:
    """A tensor or an array, as far as a torch-free check can tell: a shape and a dtype."""

    shape, dtype = (), "float32"


@pytest.mark.parametrize("output", [None, {"loss": 1.0}, 12, 0.5, Scalar()])
def test_outputs_are_what_orbit_allows_none_a_mapping_a_number_a_tensor_or_an_array(output):
    check_output(Owner(), "train_loop_end()", output)  # orbit.runner.Output


@pytest.mark.parametrize("output", [[1], "loss", object()])
def test_other_outputs_are_one_line_naming_the_hook_and_what_it_may_return(output):
    with pytest.raises(HookTypeError, match=r"^Owner\.train_loop_end\(\) returned .*: it must "
                       r"return None, a mapping of logs \(metric names to values\), a tensor, an "
                       r"array or a number\."):
        check_output(Owner(), "train_loop_end()", output)
    assert issubclass(HookTypeError, HookError) and issubclass(HookTypeError, TypeError)


@pytest.mark.parametrize(("value", "words"), [
    (None, "None"), (True, "True"), (0.5, "float 0.5"), ("abc", "str 'abc'"),
    ({"a": 1}, "dict {'a': 1}"), (object(), "an object"), ("x" * 100, "str '" + "x" * 56 + "..."),
    ("two\nlines", "str 'two\\nlines'"),
])
def test_describe_says_a_value_in_a_few_words_on_one_line(value, words):
    assert describe(value) == words
