"""Packing: several documents in one sequence, each kept apart.

A window of token shards (`cadence.data.token_shards`) is cut from documents laid end to end,
so it may hold the end of one document, whole documents, and the start of another. Packed, a
window is trained as if each document were alone:

- **position ids restart** at 0 where a document starts (and at the window's first token);
- **no target crosses a boundary**: the label of a document's last token -- the next
  document's first token -- is ``IGNORE_INDEX`` (-100, what ``cross_entropy`` skips);
- **attention stays inside each document**: `document_causal_mask` makes the block-diagonal
  causal mask from the position ids for ``scaled_dot_product_attention``. A transformers model
  (Llama and the others built on its masking utilities) makes the same mask itself from
  ``position_ids`` when it is given no ``attention_mask``.

A packed batch is ``({"input_ids": ..., "position_ids": ...}, labels)``: the Task's default
step calls the model with those keyword arguments (`cadence.task.task.call_model`), as
torchtitan and TRL (``DataCollatorWithFlattening``) feed packed sequences.

>>> import numpy as np
>>> tokens = np.array([[5, 6, 7, 8, 9]])        # one window: documents [5, 6] and [7, 8, 9]
>>> starts = np.array([[0, 0, 2, 2, 2]])        # where each token's document starts
>>> features, labels = make_batch(tokens, starts)
>>> features["position_ids"].tolist(), labels.tolist()
([[0, 1, 0, 1]], [[6, -100, 8, 9]])
"""

from __future__ import annotations

import numpy as np
import torch

IGNORE_INDEX = -100
"""The label no loss is taken on (``torch.nn.functional.cross_entropy``'s default)."""


def make_batch(tokens: np.ndarray, starts: np.ndarray | None, pin_memory: bool = False
               ) -> tuple[object, torch.Tensor]:
    """A batch from windows of ``sequence_length + 1`` tokens (``int64``, ``[n, L + 1]``):
    ``(inputs, labels)``, or -- with `starts`, where each token's document starts in its
    window -- ``({"input_ids", "position_ids"}, labels)`` packed (see the module docstring).
    In pinned memory with `pin_memory`, so that copying it to a GPU does not block the host.
    """
    count, width = tokens.shape
    length = width - 1
    parts = 2 if starts is None else 3
    out = torch.empty((parts, count, length), dtype=torch.int64, pin_memory=pin_memory)
    view = out.numpy()
    view[0] = tokens[:, :-1]
    view[1] = tokens[:, 1:]
    if starts is None:
        return out[0], out[1]
    view[2] = np.arange(length) - starts[:, :-1]
    view[1][starts[:, 1:] != starts[:, :-1]] = IGNORE_INDEX
    return {"input_ids": out[0], "position_ids": out[2]}, out[1]


def document_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """The attention mask of packed sequences: token ``i`` sees token ``j`` where ``j <= i``
    and both are in one document (a document starts where its position id is 0). A boolean
    ``[batch, 1, length, length]`` tensor for ``scaled_dot_product_attention``'s
    ``attn_mask`` (True: attend), made on the device of `position_ids` without a host sync.

    >>> document_causal_mask(torch.tensor([[0, 1, 0]]))[0, 0].int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    documents = torch.cumsum(position_ids == 0, dim=1)
    same = documents[:, :, None] == documents[:, None, :]
    length = position_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    return (same & causal)[:, None]
