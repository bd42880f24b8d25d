"""The Trainer's context-parallel helpers (`fsdp_xla.hf._parallelism`): the causal-LM loss over
``[rows, seq]`` equals transformers' own, and replaces only transformers' default."""

import pytest
import torch

from fsdp_xla.hf._parallelism import causal_lm_loss_by_token, keep_token_layout_in_loss

transformers = pytest.importorskip("transformers")
from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402


def _batch(seed=0, rows=3, seq=10, vocab=17):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, seq, vocab, generator=g, dtype=torch.float64).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (rows, seq), generator=g)
    labels[0, 7:] = -100  # right padding
    labels[2, :3] = -100  # a prompt not trained on
    return logits, labels, vocab


@pytest.mark.parametrize("num_items", [None, 23, torch.tensor(23)])
@pytest.mark.parametrize("shifted", [False, True])
def test_the_loss_by_token_is_transformers_causal_lm_loss(num_items, shifted):
    logits, labels, vocab = _batch()
    kwargs = {"num_items_in_batch": num_items}
    if shifted:
        kwargs["shift_labels"] = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()
    expected = ForCausalLMLoss(logits, labels, vocab, **kwargs)
    got = causal_lm_loss_by_token(logits, labels, vocab, **kwargs)
    assert got.dtype == expected.dtype == torch.float32
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6), (got, expected)


def test_logits_not_rows_by_tokens_go_to_transformers_own_loss():
    logits, labels, vocab = _batch()
    two_d = logits.reshape(-1, vocab)  # [rows x seq, vocab]: already flat
    assert torch.equal(causal_lm_loss_by_token(two_d, labels, vocab), ForCausalLMLoss(two_d, labels, vocab))


def test_only_transformers_default_loss_is_replaced():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=16,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    assert keep_token_layout_in_loss(model) and model.loss_function is causal_lm_loss_by_token
    assert not keep_token_layout_in_loss(model)  # already ours: the user's own from now on

    def mine(*args, **kwargs):
        return torch.zeros(())

    other = LlamaForCausalLM(config)
    other.loss_function = mine
    assert not keep_token_layout_in_loss(other) and other.loss_function is mine
