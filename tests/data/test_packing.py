"""Packing keeps documents apart: a packed sequence gives each document the logits it gets when
run alone -- in the ``gpt`` experiment's model (a block-diagonal mask through
``scaled_dot_product_attention``) and in a transformers Llama (position ids, no mask)."""

import numpy as np
import pytest
import torch

from cadence.data.packing import document_causal_mask, make_batch
from cadence.task.experiments.gpt import GPT, GPTModelConfig

DOCUMENTS = [[5, 9, 2, 7], [3, 3, 8], [1, 4, 6, 2, 9, 5]]


def packed():
    """The documents end to end in one window, and where each token's document starts."""
    tokens = np.concatenate(DOCUMENTS)[None]
    starts = np.concatenate([[at] * len(d) for at, d in zip(
        np.cumsum([0] + [len(d) for d in DOCUMENTS[:-1]]), DOCUMENTS)])[None]
    return tokens, starts


def test_a_packed_batch_restarts_positions_and_masks_targets_across_boundaries():
    tokens, starts = packed()
    features, labels = make_batch(tokens, starts)
    assert features["input_ids"].tolist() == [tokens[0, :-1].tolist()]
    assert features["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4]]
    assert labels.tolist() == [[9, 2, 7, -100, 3, 8, -100, 4, 6, 2, 9, 5]]
    inputs, plain = make_batch(tokens, None)  # unpacked: every target, one sequence
    assert plain.tolist() == [tokens[0, 1:].tolist()] and inputs.dtype == torch.int64


def test_the_document_mask_is_causal_and_block_diagonal():
    mask = document_causal_mask(torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]]))
    assert mask.shape == (2, 1, 5, 5) and mask.dtype == torch.bool
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                                         [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    assert torch.equal(mask[1, 0], torch.ones(5, 5, dtype=torch.bool).tril())


def alone_and_packed(model, call):
    """Each document's logits run alone, and the packed sequence's cut at the documents."""
    tokens, starts = packed()
    features, _ = make_batch(tokens, starts)
    with torch.no_grad():
        together = call(model, features)[0]
        alone = [call(model, {"input_ids": torch.tensor([d])})[0] for d in DOCUMENTS]
    cuts = np.cumsum([0] + [len(d) for d in DOCUMENTS])
    # the last document lost its last token to the window's last target
    return [(alone[i][: cuts[i + 1] - cuts[i]][: len(together) - cuts[i]],
             together[cuts[i]: cuts[i + 1]]) for i in range(len(DOCUMENTS))]


def test_gpt_gives_each_packed_document_the_logits_it_has_alone():
    torch.manual_seed(0)
    model = GPT(GPTModelConfig(vocab_size=16, block_size=16, n_layer=2, n_head=2, n_embd=16))
    model.eval()
    for alone, together in alone_and_packed(model, lambda m, f: m(**f)):
        torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    # ... and without the position ids, attention crosses the boundaries
    tokens, starts = packed()
    features, _ = make_batch(tokens, starts)
    with torch.no_grad():
        crossed = model(features["input_ids"])[0]
        second = model(torch.tensor([DOCUMENTS[1]]))[0]
    assert not torch.allclose(crossed[4:7], second, atol=1e-3)


def test_a_transformers_llama_gives_each_packed_document_the_logits_it_has_alone():
    """Without a cache (``use_cache=False``, as in training) transformers finds the documents
    in the position ids and masks attention between them; with a cache it does not."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, max_position_embeddings=32,
                                      attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    for alone, together in alone_and_packed(model, lambda m, f: m(**f).logits):
        torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    tokens, starts = packed()
    features, _ = make_batch(tokens, starts)
    with torch.no_grad():
        cached = model(**features, use_cache=True).logits[0]
        second = model(input_ids=torch.tensor([DOCUMENTS[1]])).logits[0]
    assert not torch.allclose(cached[4:7], second, atol=1e-3)
