"""`cadence.core.logs`: what a log value is."""

import ast
import math
from pathlib import Path

import numpy as np
import pytest

import cadence
from cadence.core.logs import is_finite_scalar, is_scalar

PACKAGE = Path(cadence.__file__).parent


@pytest.mark.parametrize(("value", "scalar", "finite"), [
    (3, True, True), (0.5, True, True), (np.float64(0.5), True, True),
    (math.nan, True, False), (-math.inf, True, False),
    (True, False, False), (np.float32(0.5), False, False), ("1", False, False),
    (None, False, False), ([1.0], False, False),
])
def test_a_scalar_is_a_real_number_not_a_bool(value, scalar, finite):
    assert (is_scalar(value), is_finite_scalar(value)) == (scalar, finite)


def test_a_real_number_not_a_bool_is_written_once_in_the_package():
    """Issue 30, item 4: "a real number, not a bool" is `is_scalar` (and `is_finite_scalar`),
    not an ``isinstance(x, (int, float)) and not isinstance(x, bool)`` in each module."""
    copies = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "core" / "logs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.BoolOp):
                continue
            checks: dict[str, set[str]] = {}
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                        and call.func.id == "isinstance" and len(call.args) == 2):
                    subject, kinds = map(ast.unparse, call.args)
                    checks.setdefault(subject, set()).add(kinds)
            if any("bool" in kinds and ({"(int, float)", "(float, int)"} & kinds)
                   for kinds in checks.values()):
                copies.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not copies, f"use cadence.core.logs.is_scalar instead: {copies}"
