"""The layout shows the layers, and the arrows between them point one way.

    core  <-  records  <-  writers  <-  data  <-  engine  <-  callbacks  <-  front-ends

(the front-ends: task, tensorpack, tfsnippet). `core` is the loop's engine; `records` holds the
run's records -- the timeline's file format, the goodput report, the record a training process
keeps -- which the engine sees only through `cadence.core.protocols.RunRecordLike`.

A layer imports only the layers to its left (and itself); the front-ends import no other
front-end; ``cadence/__init__.py`` re-exports from all. Checked from the source, imports inside
functions and under TYPE_CHECKING included.

No two modules import each other, directly or through others: not at module level, and not
inside functions either -- a function-level import that closes a circle only hides it (the two
modules are one design, split in two files). Imports under TYPE_CHECKING never run, and are left
out of that check.
"""

import ast
import importlib
from pathlib import Path

import pytest

import cadence

PACKAGE = Path(cadence.__file__).parent
ORDER = ["core", "records", "writers", "data", "engine", "callbacks"]
FRONT_ENDS = ["task", "tensorpack", "tfsnippet"]


def layer_of(module: str) -> str:
    parts = module.split(".")
    return "api" if len(parts) == 1 or parts[1] == "__main__" else parts[1]


def allowed(layer: str) -> set[str]:
    if layer in ORDER:
        return set(ORDER[: ORDER.index(layer) + 1])
    return {*ORDER, layer}


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(relative.parts).removesuffix(".__init__")
        yield name, path


def imports(path: Path, run_only: bool = False):
    """The modules `path` imports, anywhere in it; with `run_only`, not those under
    ``if TYPE_CHECKING:``, and ``from package import name`` also yields ``package.name``
    (which is a submodule where there is one)."""

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if run_only and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(
                    child.test):
                for other in child.orelse:
                    yield other
                    yield from walk(other)
                continue
            yield child
            yield from walk(child)

    for node in walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            if run_only:
                yield from (f"{node.module}.{alias.name}" for alias in node.names)


@pytest.mark.parametrize(("name", "path"), list(modules()), ids=[n for n, _ in modules()])
def test_each_module_imports_only_the_layers_below_it(name, path):
    layer = layer_of(name)
    if layer == "api":
        return
    wrong = sorted({m for m in imports(path) if m.startswith("cadence.")
                    and layer_of(m) not in allowed(layer)})
    assert not wrong, f"{name} ({layer}) imports {wrong}"


LOOK_AT = 600
"""Lines past which a module asks for a look: does it still hold one concept?"""
LONG_MODULES = {
    "cadence.core.controller": "Orbit's Controller: the outer loop of training and evaluation",
    "cadence.task.trainer": "seed 002's Trainer: a Task's steps, its updates and evaluations",
    "cadence.tfsnippet.train_loop": "tfsnippet's TrainLoop: the seed's whole API on one class",
    "cadence.records.goodput": "goodput and badput by cause from a run's timeline, and its report",
    "cadence.records.timeline": "the run timeline's file format: its schema, writer and reader",
    "cadence.task.cli": "the cadence command: its parser and one small handler per subcommand",
    "cadence.task.config": "the experiment config: one typed tree of dataclasses, documented",
    "cadence.engine.runtime": "where a process sits: its device, its group and mesh, its data "
                              "coordinate -- the one module that asks torch.distributed",
}
"""The modules past `LOOK_AT` lines that were looked at, with the one concept each holds. A
module is one concept whatever its length (STYLE.md): a long one is split when it holds
several, never to meet a count."""


@pytest.mark.parametrize(("name", "path"), list(modules()), ids=[n for n, _ in modules()])
def test_a_module_past_600_lines_was_looked_at_and_holds_one_concept(name, path):
    lines = len(path.read_text().splitlines())
    assert lines <= LOOK_AT or name in LONG_MODULES, (
        f"{name} has {lines} lines: if it holds several concepts, split it by concept; if it is "
        "one, name that concept in tests/test_layers.py's LONG_MODULES.")
    assert lines <= 3 * LOOK_AT, f"{name} has {lines} lines: no one reads that in one sitting."


def test_every_long_module_named_is_long():
    lengths = {name: len(path.read_text().splitlines()) for name, path in modules()}
    assert not [name for name in LONG_MODULES if lengths.get(name, 0) <= LOOK_AT]


def test_the_torch_free_layers_never_import_torch():
    for name, path in modules():
        if layer_of(name) in ("core", "records", "writers"):
            assert not [m for m in imports(path) if m.split(".")[0] == "torch"], name


def test_there_is_no_import_cycle_not_even_through_imports_inside_functions():
    graph = {name: {m for m in imports(path, run_only=True)
                    if m.split(".")[0] == "cadence" and m != name}
             for name, path in modules()}
    for deps in graph.values():  # `from cadence.core import x` depends on cadence.core
        deps.intersection_update(graph)
    visiting, done = set(), set()

    def visit(node, trail):
        if node in done:
            return
        assert node not in visiting, " -> ".join([*trail, node])
        visiting.add(node)
        for dep in graph[node]:
            visit(dep, [*trail, node])
        visiting.discard(node)
        done.add(node)

    for node in graph:
        visit(node, [])


@pytest.mark.parametrize("namespace", ["cadence", "cadence.tensorpack", "cadence.callbacks",
                                       "cadence.core"])
def test_every_public_name_is_importable(namespace):
    module = importlib.import_module(namespace)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing


def test_the_built_in_callbacks_read_the_declared_trainer_view_without_probing():
    """What a callback reads of the trainer is `TrainerView` (cadence.core.trainer_view), typed
    on `RunState.trainer`: no callback guesses with getattr."""
    package = Path(cadence.__file__).parent / "callbacks"
    probes = [f"{path.name}:{number}" for path in sorted(package.glob("*.py"))
              for number, line in enumerate(path.read_text().splitlines(), 1)
              if "getattr(state.trainer" in line or "getattr(state.controller" in line
              or "getattr(self._trainer" in line]
    assert probes == []


LONG_FUNCTION = 60
"""Lines of code (the docstring aside) past which a function is its named steps (STYLE.md)."""


def test_a_function_past_60_lines_says_why_in_its_docstring():
    """A function that does several named things is those named steps; one that is long for a
    reason says so in its docstring, with the words "in one piece"."""
    long = []
    for name, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            docstring = ast.get_docstring(node) or ""
            first = node.body[1] if docstring and len(node.body) > 1 else node.body[0]
            lines = node.end_lineno - first.lineno + 1
            if lines > LONG_FUNCTION and "in one piece" not in docstring:
                long.append(f"{name}.{node.name}: {lines} lines")
    assert long == []
