"""Torch-free tests run their code again in a process where torch cannot be imported."""

BLOCK_TORCH = """import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == 'torch' or name.startswith('torch.'):
            raise ImportError('torch is blocked')
sys.meta_path.insert(0, Block())
"""
"""Python code that makes importing torch fail: the start of a torch-free subprocess's code."""
