"""`cadence.core.hook_checks`: a hook's result checked at its first call, and never again."""

import copy
import pickle

import pytest

from cadence.core.errors import HookError, HookTypeError
from cadence.core.hook_checks import check_first_call, check_logs, describe


class Owner:
    def step(self, value):
        return value


def refuse_negatives(owner, result):
    if result < 0:
        raise HookTypeError(f"{type(owner).__name__}.step() returned {result}")


def test_the_first_call_is_checked_and_every_later_one_is_the_method_itself():
    owner, seen = Owner(), []
    check_first_call(owner, "step", lambda o, result: seen.append((o, result)))
    assert "step" in vars(owner)
    assert owner.step(1) == 1
    assert seen == [(owner, 1)]
    assert "step" not in vars(owner)  # no wrapper, no flag left on the way
    assert owner.step.__func__ is Owner.step
    assert owner.step(2) == 2 and owner.step(3) == 3
    assert seen == [(owner, 1)]


def test_a_refused_first_call_raises_and_later_calls_are_not_checked():
    owner = Owner()
    check_first_call(owner, "step", refuse_negatives)
    with pytest.raises(HookTypeError, match=r"Owner\.step\(\) returned -1"):
        owner.step(-1)
    assert owner.step(-2) == -2


def test_an_attribute_a_user_set_is_kept():
    before = Owner()
    before.step = lambda value: "mine"
    check_first_call(before, "step", refuse_negatives)
    assert before.step(-1) == "mine"  # nothing installed over it

    after, seen = Owner(), []
    check_first_call(after, "step", lambda o, result: seen.append(result))
    original = after.step
    after.step = lambda value: original(value) + 1  # wraps the checked method
    assert after.step(1) == 2 and seen == [1]
    assert after.step(1) == 2 and seen == [1]  # the user's attribute stays; the check is gone


def test_a_checked_owner_can_be_copied_and_pickled():
    owner = Owner()
    check_first_call(owner, "step", refuse_negatives)
    for other in (copy.deepcopy(owner), pickle.loads(pickle.dumps(owner))):
        with pytest.raises(HookTypeError):
            other.step(-1)
        assert "step" not in vars(other)
    assert "step" in vars(owner)  # the original is not checked yet


def test_logs_are_none_or_a_mapping():
    check_logs(Owner(), "train_loop_end()", None)
    check_logs(Owner(), "train_loop_end()", {"loss": 1.0})
    with pytest.raises(HookTypeError, match=r"^Owner\.train_loop_end\(\) returned list \[1\]: it "
                       r"must return None or a mapping of logs"):
        check_logs(Owner(), "train_loop_end()", [1])
    assert issubclass(HookTypeError, HookError) and issubclass(HookTypeError, TypeError)


@pytest.mark.parametrize(("value", "words"), [
    (None, "None"), (True, "True"), (0.5, "float 0.5"), ("abc", "str 'abc'"),
    ({"a": 1}, "dict {'a': 1}"), (object(), "an object"), ("x" * 100, "str '" + "x" * 56 + "..."),
    ("two\nlines", "str 'two\\nlines'"),
])
def test_describe_says_a_value_in_a_few_words_on_one_line(value, words):
    assert describe(value) == words
