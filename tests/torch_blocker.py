"""Torch-free tests run their code again in a process where torch cannot be imported."""

BLOCK_TORCH = """import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == 'torch' or name.startswith('torch.'):
            raise ImportError('torch is blocked')
sys.meta_path.insert(0, Block())
"""
"""Python code that makes importing torch fail: the start of a torch-free subprocess's code."""


def assert_passes_without_torch(test_file: str) -> None:
    """Runs the tests of `test_file` -- all but its own torch-blocked one -- again, in a process
    where importing torch fails, and checks that they pass there and never imported torch."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    code = BLOCK_TORCH + f"""
import pytest
sys.path.insert(0, {str(tests)!r})  # tests/: this module and the fakes, without conftest
code = pytest.main([{test_file!r}, '-q', '-p', 'no:cacheprovider', '--noconftest',
                    '-k', 'not torch_blocked', '-o', 'addopts='])
print('torch' in sys.modules)
sys.exit(code)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tests.parent, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split()[-1] == "False"
    assert " passed" in out.stdout and "failed" not in out.stdout
