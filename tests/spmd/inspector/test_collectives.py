"""Collectives read from HLO text, replica groups, and ring-algorithm bytes."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spmd.inspector.collectives import (
    CollectiveKind,
    collectives_of,
    module_scope,
    parse_replica_groups,
    ring_bytes_sent,
)
from spmd.inspector.hlo_text import HloModuleText
from tests.spmd.inspector.test_hlo_text import MODULE


def test_replica_group_forms():
    assert parse_replica_groups("{{0,1},{2,3}}", 4) == ((0, 1), (2, 3))
    assert parse_replica_groups("{}", 4) == ((0, 1, 2, 3),)
    assert parse_replica_groups(None, 2) == ((0, 1),)
    assert parse_replica_groups("[2,4]<=[8]", 8) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert parse_replica_groups("[4,2]<=[2,4]T(1,0)", 8) == ((0, 4), (1, 5), (2, 6), (3, 7))


@given(st.sampled_from([(2, 4), (4, 2), (8, 1), (1, 8), (2, 2, 2)]), st.data())
def test_iota_groups_match_explicit_transpose(shape, data):
    perm = data.draw(st.permutations(range(len(shape))))
    ids = np.arange(8).reshape(shape).transpose(perm)
    rows = int(ids.shape[0])
    text = f"[{rows},{8 // rows}]<={list(shape)}T({','.join(map(str, perm))})".replace(" ", "")
    expected = tuple(tuple(int(x) for x in r) for r in ids.reshape(rows, -1))
    assert parse_replica_groups(text, 8) == expected


def test_ring_bytes():
    mib = 1 << 20
    assert ring_bytes_sent(CollectiveKind.ALL_GATHER, 8 * mib, 8) == 7 * mib
    assert ring_bytes_sent(CollectiveKind.REDUCE_SCATTER, mib, 8) == 7 * mib
    assert ring_bytes_sent(CollectiveKind.ALL_REDUCE, 8 * mib, 8) == 14 * mib
    assert ring_bytes_sent(CollectiveKind.ALL_TO_ALL, 8 * mib, 8) == 7 * mib
    assert ring_bytes_sent(CollectiveKind.COLLECTIVE_PERMUTE, mib, 2) == mib
    assert ring_bytes_sent(CollectiveKind.ALL_REDUCE, mib, 1) == 0


@given(st.integers(1, 1 << 30), st.integers(2, 512))
def test_all_reduce_is_reduce_scatter_plus_all_gather(nbytes, n):
    shard = nbytes * n  # a reduce-scatter to `nbytes` per device, then gather back to n * nbytes
    rs = ring_bytes_sent(CollectiveKind.REDUCE_SCATTER, nbytes, n)
    ag = ring_bytes_sent(CollectiveKind.ALL_GATHER, shard, n)
    ar = ring_bytes_sent(CollectiveKind.ALL_REDUCE, shard, n)
    assert rs == ag == nbytes * (n - 1)
    assert ar == rs + ag


def test_collectives_of_module():
    found = collectives_of(HloModuleText.parse(MODULE))
    assert [c.kind for c in found] == [CollectiveKind.ALL_GATHER, CollectiveKind.ALL_REDUCE]
    ag, ar = found
    assert (ag.shape, ag.group_size, ag.num_groups, ag.dimensions) == ("bf16[32,16]", 8, 1, (0,))
    assert ag.result_bytes == 32 * 16 * 2
    assert ag.bytes_sent_per_device == 32 * 16 * 2 * 7 // 8
    assert ag.source_parameter == 0  # through convert fusion, get-tuple-element, opt-barrier
    assert (ar.shape, ar.group_size, ar.result_bytes, ar.bytes_sent_per_device) == ("f32[64,16]", 8, 4096, 7168)
    assert ar.source_parameter is None
    assert (ar.op_type, ar.source) == ("aten__mm", "/x/t.py:14")


SYNTHETIC = """\
HloModule m, num_partitions=4

ENTRY %main (p0: f32[8,4], p1: f32[2,4]) -> f32[2,4] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = f32[2,4]{1,0} parameter(1)
  %rs = f32[2,4]{1,0} reduce-scatter(%p0), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
  %a2a = (f32[1,4]{1,0}, f32[1,4]{1,0}) all-to-all(%p1, %p1), channel_id=2, replica_groups={{0,1},{2,3}}
  %cp = f32[2,4]{1,0} collective-permute(%rs), channel_id=3, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %ags = (f32[2,4]{1,0}, f32[8,4]{1,0}) all-gather-start(%cp), channel_id=4, replica_groups=[1,4]<=[4], dimensions={0}
  %agd = f32[8,4]{1,0} all-gather-done(%ags)
  ROOT %out = f32[2,4]{1,0} copy(%cp)
}
"""


def test_reduce_scatter_all_to_all_permute_and_async():
    found = collectives_of(HloModuleText.parse(SYNTHETIC))
    kinds = [c.kind for c in found]
    assert kinds == [
        CollectiveKind.REDUCE_SCATTER,
        CollectiveKind.ALL_TO_ALL,
        CollectiveKind.COLLECTIVE_PERMUTE,
        CollectiveKind.ALL_GATHER,
    ]
    rs, a2a, cp, ag = found
    assert rs.bytes_sent_per_device == 32 * 3  # 32-byte result, input 4x that
    assert (a2a.group_size, a2a.num_groups, a2a.result_bytes, a2a.bytes_sent_per_device) == (2, 2, 32, 16)
    assert (cp.group_size, cp.bytes_sent_per_device) == (4, 32)
    assert ag.shape == "f32[8,4]" and ag.bytes_sent_per_device == 128 * 3 // 4  # the -done is not counted


@pytest.mark.parametrize(
    "op_name, scope",
    [
        ("M.1/blocks.0.3/aten__mm", "blocks.0"),
        ("aten__mm", ""),
        ("GPT.1/h.10.attn.2/aten__mm", "h.10.attn"),
        ("M.1/blocks.1.qkv.2/aten__add.1/aten__add", "blocks.1.qkv"),
        ("aten__add.2/aten__add", ""),
    ],
)
def test_module_scope(op_name, scope):
    assert module_scope(op_name) == scope


def test_named_axis_replica_groups():
    """Newer XLA (Shardy's meshes) prints groups as mesh axes: the devices that differ only along
    the listed axes, or sub-axes 'a':(pre)size."""
    assert parse_replica_groups("mesh['axis_0'=4,'axis_1'=2] {'axis_1'}", 8) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert parse_replica_groups("mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", 8) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert parse_replica_groups("mesh['axis_0'=4] {'axis_0'}", 4) == ((0, 1, 2, 3),)
    assert parse_replica_groups("mesh['a'=8] {'a':(2)2}", 8) == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert parse_replica_groups("mesh['a'=8] {'a':(1)2,'a':(4)2}", 8) == ((0, 1, 4, 5), (2, 3, 6, 7))
    assert parse_replica_groups("mesh['a'=4,'b'=2] {'b','a'}", 8) == ((0, 2, 4, 6, 1, 3, 5, 7),)
    ids = "mesh['a'=2,'b'=4], device_ids=([2,4]<=[4,2]T(1,0)) {'b'}"
    assert parse_replica_groups(ids, 8) == ((0, 2, 4, 6), (1, 3, 5, 7))
    with pytest.raises(ValueError, match=r"axis .*'c'.* is not one of \['a'\]"):
        parse_replica_groups("mesh['a'=4] {'c'}", 4)


@given(st.sampled_from([(2, 4), (4, 2), (2, 2, 2), (8,)]), st.data())
def test_named_axis_groups_match_the_mesh(shape, data):
    """Grouping over a subset of axes is numpy's transpose-and-reshape of the device grid."""
    names = [f"a{i}" for i in range(len(shape))]
    picked = data.draw(st.lists(st.sampled_from(range(len(shape))), min_size=1, unique=True))
    text = (
        f"mesh[{','.join(f'{n!r}={s}' for n, s in zip(names, shape))}] {{{','.join(repr(names[i]) for i in picked)}}}"
    )
    kept = [i for i in range(len(shape)) if i not in picked]
    size = int(np.prod([shape[i] for i in picked]))
    expected = np.arange(8).reshape(shape).transpose(kept + picked).reshape(-1, size)
    assert parse_replica_groups(text, 8) == tuple(tuple(int(x) for x in row) for row in expected)
