"""Built-in experiments, registered by name (`cadence experiments` lists them).

* ``digits`` (the default): a classifier of scikit-learn's bundled 8x8 handwritten digits.
* ``char_lm`` / ``char_lm_large``: a character-level transformer language model trained on the
  Python standard library's own source files.
* ``gpt`` / ``gpt2_small``: a GPT-2-style decoder (tied embedding and head, pre-LayerNorm blocks)
  on the same bytes -- the reference model of the distributed tests and the benchmarks.

All use data that every installation carries: nothing is downloaded.
"""
