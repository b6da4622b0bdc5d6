"""The public API is one list: ``cadence._EXPORTS`` (each name and its module). ``__all__`` is
made from it, the lazy imports read it, and the imports under TYPE_CHECKING (for type checkers)
must name the same things from the same modules."""

import ast
import importlib
from pathlib import Path

import pytest

import cadence


def type_checking_imports() -> dict[str, str]:
    """``{name: module}`` of the imports under ``if TYPE_CHECKING:`` in cadence/__init__.py."""
    tree = ast.parse(Path(cadence.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and ast.unparse(node.test) == "TYPE_CHECKING")
    found: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"write `{alias.name} as {alias.name}`: a " \
                "re-export type checkers see"
            assert alias.name not in found, f"{alias.name} is imported twice"
            found[alias.name] = node.module
    return found


def test_all_is_the_table_of_exports_and_nothing_else():
    assert cadence.__all__ == sorted([*cadence._EXPORTS, *cadence._SUBMODULES, "__version__"])
    assert len(set(cadence.__all__)) == len(cadence.__all__)
    assert dir(cadence) == cadence.__all__
    namespace: dict = {}
    exec("from cadence import *", namespace)
    assert sorted(set(namespace) - {"__builtins__"}) == cadence.__all__


def test_the_type_checking_imports_name_the_same_things_from_the_same_modules():
    expected = {**cadence._EXPORTS}
    for name, module in cadence._SUBMODULES.items():  # `from cadence.core import summary`
        expected[name] = module.rpartition(".")[0]
    assert type_checking_imports() == expected


@pytest.mark.parametrize("name", cadence.__all__)
def test_every_public_name_imports_from_its_module(name):
    value = getattr(cadence, name)
    if name in cadence._EXPORTS:
        assert value is getattr(importlib.import_module(cadence._EXPORTS[name]), name)
    elif name in cadence._SUBMODULES:
        assert value is importlib.import_module(cadence._SUBMODULES[name])
    namespace: dict = {}
    exec(f"from cadence import {name}", namespace)
    assert namespace[name] is value


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        cadence.Nope  # noqa: B018
