"""No test waits longer inside than pytest lets it run: a subprocess's own timeout above the
test's pytest timeout would be cut short by pytest, whose error says less than the
subprocess's (the benchmark smoke test once gave its subprocess 600 s under pytest's 300 and
failed the README's test command on a loaded machine)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
DEFAULT = 300  # pyproject.toml: [tool.pytest.ini_options] timeout


def pytest_timeout(function: ast.FunctionDef) -> int:
    """The function's ``@pytest.mark.timeout(N)``, else the default."""
    for decorator in function.decorator_list:
        if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr == "timeout" and decorator.args
                and isinstance(decorator.args[0], ast.Constant)):
            return int(decorator.args[0].value)
    return DEFAULT


def inner_timeouts(function: ast.FunctionDef) -> list[int]:
    """The ``timeout=N`` constants of the calls in the function's own body."""
    return [int(keyword.value.value) for node in ast.walk(function) if isinstance(node, ast.Call)
            for keyword in node.keywords
            if keyword.arg == "timeout" and isinstance(keyword.value, ast.Constant)
            and isinstance(keyword.value.value, (int, float))]


def the_suites_tests():
    """Every test function of the suite, by its pytest name."""
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                yield f"{path.relative_to(TESTS)}::{node.name}", node


def test_no_inner_timeout_exceeds_the_tests_own():
    over = [f"{name}: a call waits up to {max(inner_timeouts(function))} s under pytest's "
            f"{pytest_timeout(function)} s" for name, function in the_suites_tests()
            if any(inner >= pytest_timeout(function) for inner in inner_timeouts(function))]
    assert not over, over
    assert len(list(the_suites_tests())) > 500  # it read the suite
