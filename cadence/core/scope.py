"""The name-scope stack that `Module.name_scope` pushes onto.

Summary tags written with `cadence.core.summary.scalar` inside a scope are prefixed by it, as in
TensorFlow, so TensorBoard groups them by module.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_STACK: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "cadence_scope", default=()
)


def current_scope() -> str:
    """The current scope path, e.g. ``"trainer/encoder"``, or ``""`` outside any scope."""
    return "/".join(_STACK.get())


@contextlib.contextmanager
def push_scope(name: str) -> Iterator[str]:
    """Enters scope `name` below the current one; yields the full path."""
    stack = (*_STACK.get(), name)
    token = _STACK.set(stack)
    try:
        yield "/".join(stack)
    finally:
        _STACK.reset(token)


def scoped(tag: str) -> str:
    """`tag` prefixed by the current scope."""
    scope = current_scope()
    return f"{scope}/{tag}" if scope else tag
