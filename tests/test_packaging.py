"""What the installed distribution says of itself: its version, its license, its classifiers."""

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import cadence
from cadence.task.cli import main

ROOT = Path(__file__).parent.parent


def test_cadence_version_prints_the_version_and_exits_0(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"cadence {cadence.__version__}\n"
    result = subprocess.run([sys.executable, "-m", "cadence", "--version"],
                            capture_output=True, text=True, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (
        0, f"cadence {cadence.__version__}\n", "")


def test_the_version_has_one_source():
    """``cadence.__version__``: the package metadata reads it (pyproject's dynamic version),
    ``cadence --version`` prints it, and no other file writes it as a string (the machine line
    of docs/benchmarks.md records the version a measurement ran: benchmarks/run.py reads it)."""
    assert metadata.version("cadence") == cadence.__version__
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject
    assert 'version = { attr = "cadence.__version__" }' in pyproject
    files = [ROOT / "README.md", ROOT / "mkdocs.yml", *(
        path for folder in ("cadence", "docs", "examples", "benchmarks", "tests")
        for path in (ROOT / folder).rglob("*") if path.suffix in (".py", ".md", ".toml", ".yml"))]
    written = [str(path.relative_to(ROOT)) for path in files
               if f'"{cadence.__version__}"' in path.read_text()]
    assert written == ["cadence/__init__.py"]


def test_the_metadata_names_the_license_by_spdx_and_ships_its_text():
    meta = metadata.metadata("cadence")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in meta.get_all("License-File", [])
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole license, not a stub
    classifiers = meta.get_all("Classifier", [])
    assert "Typing :: Typed" in classifiers
    assert "Topic :: Scientific/Engineering :: Artificial Intelligence" in classifiers
    # PEP 639: the license expression replaces the "License ::" classifiers.
    assert not [c for c in classifiers if c.startswith("License ::")]
    requires_python = meta["Requires-Python"]
    assert requires_python == ">=3.10"
    assert f"Programming Language :: Python :: 3.{sys.version_info.minor}" in classifiers
