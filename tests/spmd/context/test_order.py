"""`SequenceOrder`: the permutation into shard order, its inverse, and what each shard holds."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spmd.context import SequenceOrder
from spmd.errors import SequenceLengthError, SpmdTypeError


@given(context=st.integers(1, 8), chunk=st.integers(1, 6), load_balance=st.booleans())
def test_shards_partition_the_sequence_and_restore_inverts(context, chunk, load_balance):
    seq_len = context * chunk * (2 if load_balance else 1)
    order = SequenceOrder(seq_len, context, load_balance)
    assert sorted(order.indices.tolist()) == list(range(seq_len))
    assert torch.equal(order.indices[order.restore], torch.arange(seq_len))
    held = [order.positions(s) for s in range(context)]
    assert torch.equal(torch.cat(held), order.indices)  # shard after shard
    for s in range(context):  # the spans are the positions, in the shard's order
        from_spans = [p for start, stop in order.spans(s) for p in range(start, stop)]
        assert from_spans == held[s].tolist()


@given(context=st.integers(2, 8), chunk=st.integers(1, 6))
def test_load_balancing_gives_every_shard_the_same_causal_work(context, chunk):
    """Under a causal mask a token at position p attends p + 1 keys; each shard's sum is equal."""
    order = SequenceOrder(2 * context * chunk, context)
    work = {int((order.positions(s) + 1).sum()) for s in range(context)}
    assert len(work) == 1
    plain = SequenceOrder(2 * context * chunk, context, load_balance=False)
    assert len({int((plain.positions(s) + 1).sum()) for s in range(context)}) == context  # unbalanced


def test_the_head_tail_order_is_torch_s_and_maxtext_s():
    assert SequenceOrder(8, 2).indices.tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert SequenceOrder(8, 4).indices.tolist() == [0, 7, 1, 6, 2, 5, 3, 4]
    assert SequenceOrder(8, 2).spans(0) == ((0, 2), (6, 8))
    assert SequenceOrder(6, 1).indices.tolist() == list(range(6))  # one shard: nothing to balance


@pytest.mark.parametrize(
    "build, error, said",
    [
        (
            lambda: SequenceOrder(12, 4),
            SequenceLengthError,
            r"12 tokens .* 4 context shards: it must divide into 8 equal chunks \(2 x context.*e\.g\. 16",
        ),
        (
            lambda: SequenceOrder(10, 4, load_balance=False),
            SequenceLengthError,
            r"10 tokens .* 4 equal chunks \(one per shard\)\. Pad it to a multiple of 4 \(e\.g\. 12,",
        ),
        (lambda: SequenceOrder(8, 0), SpmdTypeError, r"context size must be an int >= 1"),
        (lambda: SequenceOrder(8.0, 2), SpmdTypeError, r"sequence length must be an int"),
        (lambda: SequenceOrder(8, 2, load_balance="yes"), SpmdTypeError, r"load_balance must be True or False"),
    ],
)
def test_lengths_that_do_not_split_are_refused_with_the_fix(build, error, said):
    with pytest.raises(error, match=said):
        build()
