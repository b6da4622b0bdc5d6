"""What a user's hook returned, checked where cadence first gets it -- and only there.

Every hook a user writes (a `Task`'s ``build_*`` and step methods, a runner's
``train_loop_end`` and ``eval_end``) is checked once, in one line naming the hook, what it
returned and what it must return (a `cadence.core.errors.HookError`), instead of failing later
in torch or in a writer with a message that names none of the user's code. The checks cost
nothing on the per-step path after the first step:

- What is known when a runner is built (the model, the data, the metrics) is checked then.
- A step hook is checked at its first call by `check_first_call`: an attribute of the instance
  stands in for the method until that call, which puts the method back and checks the result,
  so every later call finds the method itself, as if no check had been there.
- What a runner gets once per loop (``train_loop_end``'s output) is checked every time: that
  is not per step. It may be anything Orbit's ``Output`` is: a tensor, an array, a number or a
  mapping of logs.

>>> describe(None), describe(0.5), describe([1, 2]), describe(object())
('None', 'float 0.5', 'list [1, 2]', 'an object')
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

from cadence.core.errors import HookError, HookTypeError


def _article(noun: str) -> str:
    return "an" if noun[:1].lower() in "aeiou" else "a"


def describe(value: Any, limit: int = 60) -> str:
    """`value` in a few words for a message: ``None``, ``float 0.5``, ``str 'abc'``,
    ``a Tensor of shape (8,)``, ``a DataLoader``; one line, at most about `limit` characters."""
    if value is None or isinstance(value, bool):
        return repr(value)
    kind = type(value).__name__
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (int, float, complex, str)):
        try:  # a tensor or an array: its shape says more than its values
            return f"{_article(kind)} {kind} of shape {tuple(int(size) for size in shape)}"
        except (TypeError, ValueError):
            pass
    text = " ".join(repr(value).split())
    if text.startswith("<"):  # an object's default repr: its type says it
        return f"{_article(kind)} {kind}"
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return f"{kind} {text}"


def hook_error(error: type[HookError], owner: Any, hook: str, returned: str, must: str,
               fix: str = "") -> HookError:
    """``<Owner>.<hook> returned <returned>: it must return <must>. <fix>`` as `error`.

    Args:
        error: `HookTypeError` (a wrong kind) or `HookValueError` (a value that cannot be used).
        owner: the object whose hook it is (its class is named).
        hook: the call as the message shows it: ``build_losses()``,
            ``build_inputs(task.train_data)``.
        returned: what it returned, in words (`describe`).
        must: what it must return.
        fix: a sentence saying what to do, when `must` alone does not.
    """
    text = f"{type(owner).__name__}.{hook} returned {returned}: it must return {must}."
    return error(f"{text} {fix}" if fix else text)


def is_output(value: Any) -> bool:
    """Whether `value` is a runner's output as Orbit types it (``orbit.runner.Output``): a
    tensor, an array, a number (numpy's too), or a mapping of them -- or None."""
    if value is None or isinstance(value, (Mapping, numbers.Number)):
        return True
    return hasattr(value, "shape") and hasattr(value, "dtype")  # a tensor, an array, np.float32


def check_output(owner: Any, hook: str, output: Any) -> None:
    """Refuses what a runner's `hook` (``train_loop_end()``, ``eval_end()``) returned unless it
    is an output Orbit allows (`is_output`): None, a tensor, an array, a number, or a mapping of
    logs. (What the Controller writes as summaries is its own decision: a mapping.)

    Raises:
        HookTypeError: for anything else (a string, a list, an object).
    """
    if not is_output(output):
        raise hook_error(HookTypeError, owner, hook, describe(output),
                         "None, a mapping of logs (metric names to values), a tensor, an array "
                         "or a number", "E.g. return {'loss': self.loss.result()}.")


class _FirstCall:
    """``owner.<name>`` until its first call, which puts back what was there, calls it and
    checks its result."""

    __slots__ = ("check", "checked", "name", "owner", "replaced")

    def __init__(self, owner: Any, name: str, check: Callable[[Any], None]) -> None:
        self.owner, self.name, self.check = owner, name, check
        self.replaced: Any = vars(owner).get(name)
        """The instance's own attribute it stands in for; None: its class's method."""
        self.checked = False
        """Whether the first call happened (a user's wrapper may hold this one and call it
        again: it then only forwards)."""

    @property
    def __wrapped__(self) -> Any:
        """What it calls: the instance's attribute it stands in for, or the class's method
        bound to `owner`."""
        if self.replaced is not None:
            return self.replaced
        cls = type(self.owner)
        return getattr(cls, self.name).__get__(self.owner, cls)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner, name = self.owner, self.name
        if vars(owner).get(name) is self:  # later calls find what was there before
            if self.replaced is None:
                del vars(owner)[name]
            else:
                vars(owner)[name] = self.replaced
        result = self.__wrapped__(*args, **kwargs)
        if not self.checked:
            self.checked = True
            self.check(result)
        return result

    def __repr__(self) -> str:
        return f"<{type(self.owner).__name__}.{self.name}, checked at its first call>"


def check_first_call(owner: Any, name: str, check: Callable[[Any], None]) -> None:
    """Makes the next call of ``owner.<name>(...)`` hand its result to `check` (which raises
    for a result that cannot be used) before returning it. That call puts back what was there:
    every later call finds the method itself (or the instance's own attribute of that name, a
    compiled step, say), with no wrapper and no flag on its way.

    The check is an attribute of the instance `owner`, looked up before its class's method, so
    it works only where the callable is looked up on `owner` at each call: code that looked it
    up once and kept it bypasses the check.
    """
    setattr(owner, name, _FirstCall(owner, name, check))
