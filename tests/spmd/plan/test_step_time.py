"""The step-time model's pieces on hand-written HLO (pure Python, no compiler): a dot, an
all-gather over a known group, overlap of an async collective, a loop with a known trip count,
a sliced operand of a stacked array, a splash kernel. Each expected time is the arithmetic its
comment states, on tpu7x:2x2x1: 4 chips of 2 devices; per device 1153.5 TFLOP/s bf16, 3.69 TB/s
HBM and 300 GB/s of ICI (600 GB/s a chip), MXU 256."""

import gc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spmd.plan.errors import PlanError
from spmd.plan.predict._op_costs import attended_pairs, declared_blocks, splash_phase, splash_window, window_taps
from spmd.plan.predict._step_time import Calibration, predict_step, splash_head_dim_matmuls, splash_matmuls
from spmd.plan.request.attention import window_scope
from spmd.plan.request.topology import parse_slice

TARGET = parse_slice("tpu7x:2x2x1")
PEAK, HBM, ICI = 2307e12 / 2, 7380e9 / 2, 600e9 / 2
CAL = Calibration(matmul_efficiency=0.5, attention_efficiency=0.25, ring_step_seconds=1e-6)

# jax 0.7 names a kernel with its block sizes: a forward kernel's name holds "dkv" and "fused"
JAX07_FORWARD = (
    "splash_mha_fwd_residuals_block_kv_128_block_kv_compute_128_block_kv_dkv_256_block_kv_dkv_compute_256_block_kv_dq_"
    "128_block_q_256_block_q_dkv_128_block_q_dq_512_k_layout_1_q_layout_1_use_fused_bwd_kernel_False_v_layout_1.20"
)
FUSED = "_block_kv_dkv_512_block_q_dkv_512_use_fused_bwd_kernel_True.3"
SIZE_NAMES = ("q", "kv", "kv_compute", "q_dkv", "kv_dkv", "kv_dkv_compute", "q_dq", "kv_dq")

HEADER = "HloModule jit_step, is_scheduled=true, num_partitions=8\n\n"

DOT = (
    HEADER
    + """ENTRY %main (a: bf16[4096,4096], b: bf16[4096,4096]) -> bf16[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  %b = bf16[4096,4096]{1,0} parameter(1)
  ROOT %d = bf16[4096,4096]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
)
# 2 x 4096^3 FLOPs at half of peak (every dim a multiple of 256); its 3 x 32 MiB take less in HBM.
DOT_SECONDS = 2 * 4096**3 / (PEAK * 0.5)


def test_a_dot_takes_its_flops_over_peak_times_efficiency():
    t = predict_step(DOT, TARGET, CAL)
    assert t.hardware_flops == 2 * 4096**3
    assert t.seconds == pytest.approx(DOT_SECONDS)
    assert t.hbm_bytes == 3 * 4096 * 4096 * 2
    assert t.memory_seconds == pytest.approx(3 * 4096 * 4096 * 2 / HBM)
    assert t.exposed_seconds == pytest.approx(0.0)


def test_a_ragged_dim_pays_for_its_padding_to_the_matrix_unit():
    ragged = DOT.replace("4096,4096]{1,0} parameter(1)", "4096,384]{1,0} parameter(1)")
    ragged = ragged.replace("ROOT %d = bf16[4096,4096]", "ROOT %d = bf16[4096,384]")
    # 384 columns fill 384 / 512 of the two MXU passes they take: 2 x 4096 x 384 x 4096 FLOPs / 0.75
    expected = 2 * 4096 * 384 * 4096 / (PEAK * 0.5 * 0.75)
    assert predict_step(ragged, TARGET, CAL).seconds == pytest.approx(expected)


WINDOWED = (
    HEADER
    + """%fused (x: bf16[512,512,1], w: bf16[16,512,512]) -> bf16[16,512,512] {
  %x = bf16[512,512,1]{2,1,0} parameter(0)
  %w = bf16[16,512,512]{2,1,0} parameter(1)
  ROOT %c = bf16[16,512,512]{2,1,0} convolution(%x, %w), window={size=16 pad=15_15 rhs_reversal=1}, dim_labels=bf0_0oi->0fb
}

ENTRY %main (x: bf16[512,512,1], w: bf16[16,512,512]) -> bf16[16,512,512] {
  %x = bf16[512,512,1]{2,1,0} parameter(0)
  %w = bf16[16,512,512]{2,1,0} parameter(1)
  ROOT %f = bf16[16,512,512]{2,1,0} fusion(%x, %w), kind=kOutput, calls=%fused
}
"""
)


def test_a_batched_matmul_written_as_a_window_counts_one_tap_per_output():
    # how libtpu writes 16 batched [512 x 512] @ [512 x 512] matmuls: a window of 16 over an input
    # of length 1, so each output meets one tap: 2 x (16 x 512 x 512) x 512 FLOPs, not 16 times it
    assert predict_step(WINDOWED, TARGET, CAL).hardware_flops == 2 * 16 * 512 * 512 * 512


# How libtpu writes two stacked projections of one input (a fused q/k/v or MLP, einsum
# "...i,koi->...ko"): the stack a window of 2 over an input of length 1, padded by 1 either side;
# the kernel lists its spatial dims 1 then 0, the window 0 then 1.
STACKED_PROJECTIONS = (
    WINDOWED.replace("x: bf16[512,512,1]", "x: bf16[4,64,128,1]")
    .replace("%x = bf16[512,512,1]{2,1,0}", "%x = bf16[4,64,128,1]{3,2,1,0}")
    .replace("w: bf16[16,512,512]", "w: bf16[2,32,128,1]")
    .replace("%w = bf16[16,512,512]{2,1,0}", "%w = bf16[2,32,128,1]{3,2,1,0}")
    .replace("bf16[16,512,512]", "bf16[4,64,2,32]")
    .replace(
        "window={size=16 pad=15_15 rhs_reversal=1}, dim_labels=bf0_0oi->0fb",
        "window={size=1x2 pad=0_0x1_1 rhs_reversal=0x1}, dim_labels=0bf1_1oi0->0b1f",
    )
)


def test_a_window_s_dims_are_the_spatial_dims_in_number_order_not_the_kernel_s():
    # each of the 4 x 64 x 2 outputs of 32 features meets one tap of 128 inputs; pairing the window's
    # dim 1 (2 taps, padded) with the kernel's first-listed spatial dim miscounted it (a fused
    # projection's program counted 0.80 x the model's FLOPs, the same program unfused 1.20 x)
    assert predict_step(STACKED_PROJECTIONS, TARGET, CAL).hardware_flops == 2 * 4 * 64 * 2 * 32 * 128


# How libtpu writes attention's 16 batched [1024 x 64] @ [64 x 1024] matmuls (2 sequences x 8 heads
# of a GPT-2): a window of 16 over the 16 batch rows dilated by 16 (15 holes between them), stride 15.
DILATED = (
    WINDOWED.replace("x: bf16[512,512,1]", "x: bf16[16,1024,64]")
    .replace("%x = bf16[512,512,1]{2,1,0}", "%x = bf16[16,1024,64]{2,1,0}")
    .replace("w: bf16[16,512,512]", "w: bf16[16,1024,64]")
    .replace("%w = bf16[16,512,512]{2,1,0}", "%w = bf16[16,1024,64]{2,1,0}")
)
DILATED = DILATED.replace("bf16[16,512,512]", "bf16[16,1024,1024]").replace(
    "window={size=16 pad=15_15 rhs_reversal=1}, dim_labels=bf0_0oi->0fb",
    "window={size=16 stride=15 lhs_dilate=16}, dim_labels=0bf_0oi->0bf",
)


def test_a_batched_matmul_over_a_dilated_input_counts_one_tap_per_output():
    # each output position's window of 16 meets one of the 16 rows (the other 15 taps fall in the
    # holes): 2 x (16 x 1024 x 1024) x 64 FLOPs; counting the window's 16 taps made a GPT-2's
    # program 3.2 x its model's FLOPs
    assert predict_step(DILATED, TARGET, CAL).hardware_flops == 2 * 16 * 1024 * 1024 * 64


@pytest.mark.parametrize(
    ("window", "lhs", "out", "taps"),
    [
        ("size=16 stride=15 lhs_dilate=16", (16,), (16,), 1.0),
        ("size=16 pad=15_15 rhs_reversal=1", (1,), (16,), 1.0),
        ("size=3 pad=1_1", (8,), (8,), (2 + 3 * 6 + 2) / 8),  # a real 3-tap convolution: the edges meet 2
        ("size=2 lhs_dilate=2", (4,), (6,), 1.0),  # [a _ b _ c _ d]: every window of 2 meets one element
        ("size=1x4 pad=0_0x3_3", (5, 1), (5, 4), 1.0),
        ("size=4 rhs_dilate=2", (7,), (1,), 4.0),
    ],
)
def test_window_taps_count_the_taps_that_meet_the_input(window, lhs, out, taps):
    assert window_taps(window, lhs, out) == pytest.approx(taps)


def test_the_flops_are_listed_op_by_op_with_their_loops():
    t = predict_step(LOOP, TARGET, CAL)
    (entry,) = t.flops_by_op
    assert (entry.op, entry.opcode, entry.loops, entry.runs) == ("d", "dot", (("w", 5),), 5)
    assert entry.flops == entry.flops_per_run * 5 == t.hardware_flops == 5 * 2 * 4096**3


def test_a_prediction_keeps_no_program_alive():
    """Each prediction parses its program (GiB for a large model): a cache on the class kept every
    one, 14 GiB after 14 published runs in one process."""
    from spmd.plan.predict import _step_time

    for program in (LOOP, WINDOWED, SLICED):  # fusions: their matmuls and operands are cached per program
        predict_step(program, TARGET, CAL)
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is _step_time._Program]


def gather(group: str, name: str = "all-gather") -> str:
    return (
        HEADER
        + f"""ENTRY %main (s: bf16[1024,1024]) -> bf16[8192,1024] {{
  %s = bf16[1024,1024]{{1,0}} parameter(0)
  ROOT %g = bf16[8192,1024]{{1,0}} {name}(%s), channel_id=1, replica_groups={group}, dimensions={{0}}, use_global_device_ids=true
}}
"""
    )


def test_an_all_gather_over_the_slice_takes_its_ring_bytes_over_every_link():
    # 8 devices (4 chips on a 2 x 2 torus: both dimensions, all the chip's links): a ring sends
    # 7/8 of the 16 MiB result in 7 steps of 1 us.
    expected = 7 * 1e-6 + 16 * 2**20 * 7 / 8 / ICI
    t = predict_step(gather("{{0,1,2,3,4,5,6,7}}"), TARGET, CAL)
    assert t.seconds == pytest.approx(expected)
    assert t.collective_seconds == pytest.approx(expected)
    assert t.exposed_seconds == pytest.approx(expected)


def test_an_all_gather_along_one_torus_dimension_gets_its_share_of_the_links():
    # 4 devices are 2 chips: one of the torus's two dimensions, half the bandwidth; 3 ring steps.
    group = gather("{{0,1,2,3},{4,5,6,7}}").replace("bf16[8192,1024]", "bf16[4096,1024]")
    expected = 3 * 1e-6 + 8 * 2**20 * 3 / 4 / (ICI / 2)
    assert predict_step(group, TARGET, CAL).seconds == pytest.approx(expected)


def async_gather_around(dot_first: bool) -> str:
    """An async all-gather whose start and done enclose the dot (or follow it)."""
    start = "  %gs = (bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0}) all-gather-start(%s), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true\n"
    done = "  %gd = bf16[8192,1024]{1,0} all-gather-done(%gs)\n"
    dot = "  %d = bf16[4096,4096]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    body = (dot + start + done) if dot_first else (start + dot + done)
    return (
        HEADER
        + "ENTRY %main (a: bf16[4096,4096], b: bf16[4096,4096], s: bf16[1024,1024]) -> (bf16[4096,4096], bf16[8192,1024]) {\n"
        + "  %a = bf16[4096,4096]{1,0} parameter(0)\n  %b = bf16[4096,4096]{1,0} parameter(1)\n"
        + "  %s = bf16[1024,1024]{1,0} parameter(2)\n"
        + body
        + "  ROOT %t = (bf16[4096,4096]{1,0}, bf16[8192,1024]{1,0}) tuple(%d, %gd)\n}\n"
    )


def test_an_async_collective_hides_behind_the_work_scheduled_inside_it():
    gather_seconds = 7 * 1e-6 + 16 * 2**20 * 7 / 8 / ICI  # 55.9 us, shorter than the dot's 238 us
    hidden = predict_step(async_gather_around(dot_first=False), TARGET, CAL)
    assert hidden.seconds == pytest.approx(DOT_SECONDS)
    assert hidden.exposed_seconds == pytest.approx(0.0)
    exposed = predict_step(async_gather_around(dot_first=True), TARGET, CAL)  # nothing between start and done
    assert exposed.seconds == pytest.approx(DOT_SECONDS + gather_seconds)


_GATHER = "channel_id=5, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true"
_START_OUT = "(bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0}, u32[])"
_CONTINUED = "(bf16[4096,4096]{1,0}, bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0}, bf16[8192,1024]{1,0})"


def async_collective_fusion(done_first: bool) -> str:
    """libtpu's async collective fusion (v5e): an all-gather started by a fusion, a continuation
    fusion that runs the dot while passing the gather's buffers through (the collective inside it,
    the buffers aliased), and a done fusion; with ``done_first``, the done before the dot."""
    start = f"  %st = {_START_OUT} fusion(%s), kind=kCustom, calls=%start_comp\n"
    start += "  %s0 = bf16[1024,1024]{1,0} get-tuple-element(%st), index=0\n"
    start += "  %s1 = bf16[8192,1024]{1,0} get-tuple-element(%st), index=1\n"
    dot = f"  %c = {_CONTINUED} fusion(%s0, %s1, %a, %b), kind=kOutput, calls=%continued_comp\n"
    dot += "  %c0 = bf16[4096,4096]{1,0} get-tuple-element(%c), index=0\n"
    done = "  %dn = bf16[8192,1024]{1,0} fusion(%s0, %s1), kind=kCustom, calls=%done_comp\n"
    return (
        HEADER
        + "%start_comp (p0: bf16[1024,1024]) -> (bf16[1024,1024], bf16[8192,1024], u32[]) {\n"
        + "  %p0 = bf16[1024,1024]{1,0} parameter(0)\n"
        + f"  %ag = bf16[8192,1024]{{1,0}} all-gather(%p0), {_GATHER}\n"
        + f'  ROOT %cc = {_START_OUT} custom-call(%ag), custom_call_target="AsyncCollectiveStart"\n}}\n\n'
        + "%continued_comp (q0: bf16[1024,1024], q1: bf16[8192,1024], x: bf16[4096,4096], y: bf16[4096,4096]) -> "
        + "(bf16[4096,4096], bf16[1024,1024], bf16[8192,1024], bf16[8192,1024]) {\n"
        + "  %q0 = bf16[1024,1024]{1,0} parameter(0)\n  %q1 = bf16[8192,1024]{1,0} parameter(1)\n"
        + "  %x = bf16[4096,4096]{1,0} parameter(2)\n  %y = bf16[4096,4096]{1,0} parameter(3)\n"
        + "  %d = bf16[4096,4096]{1,0} dot(%x, %y), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
        + f"  %ag2 = bf16[8192,1024]{{1,0}} all-gather(%q0), {_GATHER}\n"
        + f"  ROOT %t = {_CONTINUED} tuple(%d, %q0, %q1, %ag2)\n}}\n\n"
        + "%done_comp (r0: bf16[1024,1024], r1: bf16[8192,1024]) -> bf16[8192,1024] {\n"
        + "  %r0 = bf16[1024,1024]{1,0} parameter(0)\n  %r1 = bf16[8192,1024]{1,0} parameter(1)\n"
        + f"  %ag3 = bf16[8192,1024]{{1,0}} all-gather(%r0), {_GATHER}\n"
        + '  ROOT %cd = bf16[8192,1024]{1,0} custom-call(%r0, %r1, %ag3), custom_call_target="AsyncCollectiveDone"\n}\n\n'
        + "ENTRY %main (a: bf16[4096,4096], b: bf16[4096,4096], s: bf16[1024,1024]) -> (bf16[4096,4096], bf16[8192,1024]) {\n"
        + "  %a = bf16[4096,4096]{1,0} parameter(0)\n  %b = bf16[4096,4096]{1,0} parameter(1)\n"
        + "  %s = bf16[1024,1024]{1,0} parameter(2)\n"
        + start
        + (done + dot if done_first else dot + done)
        + "  ROOT %r = (bf16[4096,4096]{1,0}, bf16[8192,1024]{1,0}) tuple(%c0, %dn)\n}\n"
    )


def test_libtpus_async_collective_fusion_runs_its_collective_on_the_links_beside_the_continuation():
    gather_seconds = 7 * 1e-6 + 16 * 2**20 * 7 / 8 / ICI  # as the all-gather-start's above
    hidden = predict_step(async_collective_fusion(done_first=False), TARGET, CAL)
    assert hidden.collective_seconds == pytest.approx(gather_seconds)  # the start's collective, once
    assert hidden.seconds == pytest.approx(DOT_SECONDS) and hidden.exposed_seconds == pytest.approx(0.0)
    # the continuation's HBM traffic is the dot's: a and b read, d written; the gather's buffers it
    # passes through (aliased) and the collective's bytes are the links' (they were counted as the
    # fusion's, 1.5 TB a step of the v5e 128B on 2 slices), and the start and done move nothing
    assert hidden.hbm_bytes == 3 * 32 * 2**20
    exposed = predict_step(async_collective_fusion(done_first=True), TARGET, CAL)
    assert exposed.seconds == pytest.approx(DOT_SECONDS + gather_seconds)


def async_collective_fusion_around_a_loop(trips: int) -> str:
    """`async_collective_fusion` with its continuation in a ``while`` loop of ``trips`` trips (as
    libtpu runs a windowed einsum's continuations), its start before the loop and its done after."""
    plain = async_collective_fusion(done_first=False)
    computations = plain[len(HEADER) : plain.index("ENTRY")]
    state = "(s32[], bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0}, bf16[4096,4096]{1,0}, bf16[4096,4096]{1,0})"
    return (
        HEADER
        + computations
        + "%cond (p: (s32[], bf16[1024,1024], bf16[8192,1024], bf16[4096,4096], bf16[4096,4096])) -> pred[] {\n"
        + f"  %p = {state} parameter(0)\n  %i = s32[] get-tuple-element(%p), index=0\n"
        + f"  %n = s32[] constant({trips})\n  ROOT %lt = pred[] compare(%i, %n), direction=LT\n}}\n\n"
        + f"%body (p: (s32[], bf16[1024,1024], bf16[8192,1024], bf16[4096,4096], bf16[4096,4096])) -> {state} {{\n"
        + f"  %p = {state} parameter(0)\n  %i = s32[] get-tuple-element(%p), index=0\n"
        + "  %s0 = bf16[1024,1024]{1,0} get-tuple-element(%p), index=1\n"
        + "  %s1 = bf16[8192,1024]{1,0} get-tuple-element(%p), index=2\n"
        + "  %a = bf16[4096,4096]{1,0} get-tuple-element(%p), index=3\n"
        + "  %b = bf16[4096,4096]{1,0} get-tuple-element(%p), index=4\n"
        + f"  %c = {_CONTINUED} fusion(%s0, %s1, %a, %b), kind=kOutput, calls=%continued_comp\n"
        + "  %c0 = bf16[4096,4096]{1,0} get-tuple-element(%c), index=0\n"
        + "  %one = s32[] constant(1)\n  %next = s32[] add(%i, %one)\n"
        + f"  ROOT %t = {state} tuple(%next, %s0, %s1, %c0, %b)\n}}\n\n"
        + "ENTRY %main (a: bf16[4096,4096], b: bf16[4096,4096], s: bf16[1024,1024]) -> bf16[8192,1024] {\n"
        + "  %a = bf16[4096,4096]{1,0} parameter(0)\n  %b = bf16[4096,4096]{1,0} parameter(1)\n"
        + "  %s = bf16[1024,1024]{1,0} parameter(2)\n"
        + f"  %st = {_START_OUT} fusion(%s), kind=kCustom, calls=%start_comp\n"
        + "  %s0 = bf16[1024,1024]{1,0} get-tuple-element(%st), index=0\n"
        + "  %s1 = bf16[8192,1024]{1,0} get-tuple-element(%st), index=1\n"
        + "  %zero = s32[] constant(0)\n"
        + f"  %init = {state} tuple(%zero, %s0, %s1, %a, %b)\n"
        + f"  %w = {state} while(%init), condition=%cond, body=%body\n"
        + "  %w1 = bf16[1024,1024]{1,0} get-tuple-element(%w), index=1\n"
        + "  %w2 = bf16[8192,1024]{1,0} get-tuple-element(%w), index=2\n"
        + "  ROOT %dn = bf16[8192,1024]{1,0} fusion(%w1, %w2), kind=kCustom, calls=%done_comp\n}\n"
    )


def test_an_async_collective_continued_in_a_loop_runs_once_and_is_counted_once():
    from spmd.plan.compile.program import step_collectives

    looped = async_collective_fusion_around_a_loop(trips=4)
    t = predict_step(looped, TARGET, CAL)
    assert t.hardware_flops == 4 * 2 * 4096**3
    assert t.collective_seconds == pytest.approx(7 * 1e-6 + 16 * 2**20 * 7 / 8 / ICI)  # once, not per trip
    assert t.exposed_seconds == pytest.approx(0.0)
    # the report's collectives: the start's all-gather once; counting the continuation's inside the
    # loop too made the v5e 128B's step 2,297 all-gathers where it runs 1,285
    gathers = [c for c in step_collectives(looped) if c.kind.value == "all-gather"]
    assert [c.count for c in gathers] == [1]


def host_transfers(*moves: str, rows: int = 2048) -> str:
    """A dot with host transfers started before it and done after it: ``"out"`` writes a device
    array of ``rows`` x 1024 bf16 into a host-memory stack (an async dynamic-update-slice), ``"in"``
    reads one such slice from it (an async dynamic-slice), as libtpu writes offloaded residuals;
    ``"copy-out"`` copies the device array to host memory whole (a ``copy-start``)."""
    slab, stack = f"bf16[1,{rows},1024]{{2,1,0}}", f"bf16[8,{rows},1024]{{2,1,0:S(5)}}"
    computations, starts, dones, results = "", "", "", []
    for k, move in enumerate(moves):
        if move == "out":
            computations += (
                f"%put.{k} (h: bf16[8,{rows},1024], x: bf16[1,{rows},1024], i: s32[]) -> bf16[8,{rows},1024] {{\n"
                f"  %h = {stack} parameter(0)\n  %x = {slab} parameter(1)\n  %i = s32[] parameter(2)\n"
                f"  %z = s32[] constant(0)\n"
                f"  ROOT %u = {stack} dynamic-update-slice(%h, %x, %i, %z, %z)\n}}\n\n"
            )
            starts += (
                f"  %start.{k} = (({stack}, {slab}, s32[]), {stack}, u32[]{{:S(2)}}) "
                f"async-start(%stack, %slab, %i), calls=%put.{k}\n"
            )
            dones += f"  %done.{k} = {stack} async-done(%start.{k})\n"
        elif move == "copy-out":  # a whole array copied to host memory
            host_slab = slab.replace("}", ":S(5)}")
            starts += f"  %start.{k} = ({host_slab}, {slab}, u32[]{{:S(2)}}) copy-start(%slab)\n"
            dones += f"  %done.{k} = {host_slab} copy-done(%start.{k})\n"
        else:
            computations += (
                f"%get.{k} (h: bf16[8,{rows},1024], i: s32[]) -> bf16[1,{rows},1024] {{\n"
                f"  %h = {stack} parameter(0)\n  %i = s32[] parameter(1)\n  %z = s32[] constant(0)\n"
                f"  ROOT %s = {slab} dynamic-slice(%h, %i, %z, %z), dynamic_slice_sizes={{1,{rows},1024}}\n}}\n\n"
            )
            starts += (
                f"  %start.{k} = (({stack}, s32[]), {slab}, u32[]{{:S(2)}}) async-start(%stack, %i), calls=%get.{k}\n"
            )
            dones += f"  %done.{k} = {slab} async-done(%start.{k})\n"
        results.append(f"%done.{k}")
    return (
        HEADER
        + computations
        + f"ENTRY %main (a: bf16[4096,4096], b: bf16[4096,4096], stack: bf16[8,{rows},1024], slab: bf16[1,{rows},1024], i: s32[]) -> bf16[4096,4096] {{\n"
        + "  %a = bf16[4096,4096]{1,0} parameter(0)\n  %b = bf16[4096,4096]{1,0} parameter(1)\n"
        + f"  %stack = {stack} parameter(2)\n  %slab = {slab} parameter(3)\n  %i = s32[] parameter(4)\n"
        + starts
        + "  %d = bf16[4096,4096]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
        + dones
        + "  ROOT %r = bf16[4096,4096]{1,0} copy(%d)\n}\n"
    )


# A slice of 2048 x 1024 bf16 (4 MiB) over a device's half of the chip's 16 GB/s: 524 us, longer
# than the dot's 238 us; the copy at the end reads and writes 32 MiB in HBM.
SLICE_SECONDS = 4 * 2**20 / (16e9 / 2)
COPY_SECONDS = 2 * 32 * 2**20 / HBM


def test_a_host_transfer_hides_behind_the_work_scheduled_inside_it():
    quarter = predict_step(host_transfers("out", rows=512), TARGET, CAL)  # 131 us, inside the dot
    assert quarter.seconds == pytest.approx(DOT_SECONDS + COPY_SECONDS)


@pytest.mark.parametrize(
    ("moves", "transfers"),
    [
        (("out",), 1),
        (("in",), 1),
        (("out", "in"), 1),
        (("out", "out"), 2),
        (("in", "in"), 2),
        (("copy-out", "out"), 2),
        (("copy-out", "in"), 1),
    ],
    ids=[
        "write",
        "read",
        "write-and-read-at-once",
        "two-writes-in-turn",
        "two-reads-in-turn",
        "a-copy-and-a-write-in-turn",
        "a-copy-and-a-read-at-once",
    ],
)
def test_host_transfers_take_the_chip_s_pcie_link_one_link_each_way(moves, transfers):
    # the device waits at the done for the link: a write and a read share no link (PCIe is full
    # duplex); two writes, or two reads, go one after the other
    t = predict_step(host_transfers(*moves), TARGET, CAL)
    assert t.seconds == pytest.approx(transfers * SLICE_SECONDS + COPY_SECONDS)
    assert t.op_seconds == pytest.approx(DOT_SECONDS + COPY_SECONDS)  # the DMA is not the device's work


LOOP = (
    HEADER
    + """%cond (p: (s32[], bf16[4096,4096])) -> pred[] {
  %p = (s32[], bf16[4096,4096]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], bf16[4096,4096])) -> (s32[], bf16[4096,4096]) {
  %p = (s32[], bf16[4096,4096]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = bf16[4096,4096]{1,0} get-tuple-element(%p), index=1
  %d = bf16[4096,4096]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[4096,4096]{1,0}) tuple(%next, %d)
}

ENTRY %main (x: bf16[4096,4096]) -> (s32[], bf16[4096,4096]) {
  %x = bf16[4096,4096]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[4096,4096]{1,0}) tuple(%zero, %x)
  ROOT %w = (s32[], bf16[4096,4096]{1,0}) while(%init), condition=%cond, body=%body
}
"""
)


def test_a_loop_body_counts_its_trip_count_times():
    t = predict_step(LOOP, TARGET, CAL)
    # five dots; the counter's add moves 12 bytes (3 x s32) in each of the 5 trips
    assert t.hardware_flops == 5 * 2 * 4096**3
    assert t.seconds == pytest.approx(5 * DOT_SECONDS + 5 * 12 / HBM)


# The TPU compiler's windowed einsum (a matmul overlapped with its all-gather): a loop counting in
# u32 from 0 by 2 (a shard each way round the ring per trip) to 8, through a copy of its start.
WINDOWED_EINSUM = (
    HEADER
    + """%cond (p: (bf16[4096,4096], u32[])) -> pred[] {
  %n = u32[] constant(8)
  %p = (bf16[4096,4096]{1,0}, u32[]) parameter(0)
  ROOT %lt = pred[] compare(%p#1, %n), direction=LT
}

%body (p: (bf16[4096,4096], u32[])) -> (bf16[4096,4096], u32[]) {
  %two = u32[] constant(2)
  %p = (bf16[4096,4096]{1,0}, u32[]) parameter(0)
  %d = bf16[4096,4096]{1,0} dot(%p#0, %p#0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %next = u32[] add(%p#1, %two)
  ROOT %t = (bf16[4096,4096]{1,0}, u32[]) tuple(%d, %next)
}

ENTRY %main (x: bf16[4096,4096]) -> (bf16[4096,4096], u32[]) {
  %x = bf16[4096,4096]{1,0} parameter(0)
  %zero = u32[] constant(0)
  %start = u32[] copy(%zero)
  %init = (bf16[4096,4096]{1,0}, u32[]) tuple(%x, %start)
  ROOT %w = (bf16[4096,4096]{1,0}, u32[]) while(%init), condition=%cond, body=%body
}
"""
)


def test_a_windowed_einsum_loop_counts_from_its_start_by_its_step():
    # i = 0, 2, 4, 6: four dots (not one: a u32 bound; not eight: a step of 2)
    assert predict_step(WINDOWED_EINSUM, TARGET, CAL).hardware_flops == 4 * 2 * 4096**3


SLICED = (
    HEADER
    + """%fused (w: bf16[80,1024,1024], i: s32[]) -> bf16[1024,1024] {
  %w = bf16[80,1024,1024]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = bf16[1,1024,1024]{2,1,0} dynamic-slice(%w, %i, %z, %z), dynamic_slice_sizes={1,1024,1024}
  ROOT %r = bf16[1024,1024]{1,0} bitcast(%ds)
}

ENTRY %main (w: bf16[80,1024,1024], i: s32[]) -> bf16[1024,1024] {
  %w = bf16[80,1024,1024]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  ROOT %f = bf16[1024,1024]{1,0} fusion(%w, %i), kind=kLoop, calls=%fused
}
"""
)


def test_a_fusion_reading_one_layer_of_a_stacked_array_moves_that_layer_only():
    # reads the 2 MiB slice (not the 160 MiB stack) and writes 2 MiB; the index is 4 bytes
    t = predict_step(SLICED, TARGET, CAL)
    assert t.hbm_bytes == 2 * 2 * 2**20 + 4
    assert t.seconds == pytest.approx((4 * 2**20 + 4) / HBM)


# How libtpu 0.0.52 writes a layer's residual into its stack and reads it back (trimmed from the
# Llama 3.1-70B plans): the stack goes through a nested fusion aliased to it, a relayout in place
# ({T(16,128)} to {T(8,128)} of bf16, the same bytes), and the result is a tuple with another output.
STACKED = (
    HEADER
    + """%relayout (p: bf16[80,1024,1024]) -> bf16[80,1024,1024] {
  %p = bf16[80,1024,1024]{2,1,0:T(16,128)(2,1)} parameter(0)
  ROOT %c = bf16[80,1024,1024]{2,1,0:T(8,128)(2,1)} copy(%p)
}

%write (stack: bf16[80,1024,1024], i: s32[], x: bf16[1024,1024]) -> (bf16[80,1024,1024], bf16[1024,1024]) {
  %stack = bf16[80,1024,1024]{2,1,0:T(16,128)(2,1)} parameter(0)
  %view = bf16[80,1024,1024]{2,1,0:T(8,128)(2,1)} fusion(%stack), kind=kLoop, output_to_operand_aliasing={{}: (0, {})}, calls=%relayout
  %i = s32[] parameter(1)
  %x = bf16[1024,1024]{1,0} parameter(2)
  %y = bf16[1024,1024]{1,0} negate(%x)
  %layer = bf16[1,1024,1024]{2,1,0} bitcast(%y)
  %z = s32[] constant(0)
  %dus = bf16[80,1024,1024]{2,1,0:T(16,128)(2,1)} dynamic-update-slice(%view, %layer, %i, %z, %z)
  ROOT %t = (bf16[80,1024,1024]{2,1,0:T(16,128)(2,1)}, bf16[1024,1024]{1,0}) tuple(%dus, %y)
}

%read (stack: bf16[80,1024,1024], i: s32[]) -> bf16[1,1024,1024] {
  %stack = bf16[80,1024,1024]{2,1,0:T(16,128)(2,1)} parameter(0)
  %view = bf16[80,1024,1024]{2,1,0:T(8,128)(2,1)} fusion(%stack), kind=kLoop, output_to_operand_aliasing={{}: (0, {})}, calls=%relayout
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = bf16[1,1024,1024]{2,1,0} dynamic-slice(%view, %i, %z, %z), dynamic_slice_sizes={1,1024,1024}
}

ENTRY %main (w: bf16[80,1024,1024], i: s32[], x: bf16[1024,1024]) -> bf16[1,1024,1024] {
  %w = bf16[80,1024,1024]{2,1,0:T(16,128)(2,1)} parameter(0)
  %i = s32[] parameter(1)
  %x = bf16[1024,1024]{1,0} parameter(2)
  %f = (bf16[80,1024,1024]{2,1,0:T(16,128)(2,1)}, bf16[1024,1024]{1,0}) fusion(%w, %i, %x), kind=kLoop, calls=%write
  %s = bf16[80,1024,1024]{2,1,0:T(16,128)(2,1)} get-tuple-element(%f), index=0
  ROOT %r = bf16[1,1024,1024]{2,1,0} fusion(%s, %i), kind=kLoop, calls=%read
}
"""
)


def test_a_layer_written_into_or_read_from_its_stack_through_a_relayout_in_place_moves_that_layer():
    # write: x read (2 MiB), the layer written into the stack in place (2 MiB) and y written (2 MiB),
    # the index (4 bytes); read: the 2 MiB slice, written (2 MiB), and the index. Not the 160 MiB
    # stack, which the relayout only views (counted whole, each way, it was 320 MiB a fusion).
    t = predict_step(STACKED, TARGET, CAL)
    assert t.hbm_bytes == 3 * 2 * 2**20 + 4 + 2 * 2 * 2**20 + 4


SPLASH = (
    HEADER
    + """ENTRY %main (q: bf16[2,4,2048,128], k: bf16[2,4,2048,128], v: bf16[2,4,2048,128]) -> bf16[2,4,2048,128] {
  %q = bf16[2,4,2048,128]{3,2,1,0} parameter(0)
  %k = bf16[2,4,2048,128]{3,2,1,0} parameter(1)
  %v = bf16[2,4,2048,128]{3,2,1,0} parameter(2)
  ROOT %splash_mha_fwd_residuals.1 = bf16[2,4,2048,128]{3,2,1,0} custom-call(%q, %k, %v), custom_call_target="tpu_custom_call", operand_layout_constraints={bf16[2,4,2048,128]{3,2,1,0}, bf16[2,4,2048,128]{3,2,1,0}, bf16[2,4,2048,128]{3,2,1,0}}
}
"""
)


def test_a_splash_forward_kernel_runs_two_causal_matmuls():
    # q k^T and p v over 2 x 4 heads: 2 x (2 x 8 x 2048 x 2048 x 128) FLOPs, half of them masked
    flops = 2 * 2 * 8 * 2048 * 2048 * 128 / 2
    t = predict_step(SPLASH, TARGET, CAL)
    assert t.hardware_flops == flops
    # q k^T contracts over the head dim, 128 of TPU7x's 256-deep matrix unit: half of it, so that
    # matmul takes twice its FLOPs' time; p v contracts over keys and fills it
    assert t.seconds == pytest.approx((flops / 2 + flops / 2 / 0.5) / (PEAK * 0.25))
    assert [splash_matmuls(n) for n in ("splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv", "fusion")] == [2, 3, 4, 0]
    names = ("splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv", "splash_mha_dkv" + FUSED, "fusion")
    assert [splash_matmuls(n) for n in names] == [2, 3, 4, 5, 0]
    assert [splash_head_dim_matmuls(n) for n in names] == [1, 2, 2, 2, 0]
    # a 128-wide matrix unit (v5e) is filled by a head of 128: the kernel at its FLOPs' time
    v5e = predict_step(SPLASH.replace("num_partitions=8", "num_partitions=4"), parse_slice("v5e:2x2"), CAL)
    assert v5e.seconds == pytest.approx(flops / (197e12 * 0.25))


def test_a_splash_kernel_s_integer_mask_tables_are_not_its_queries():
    # at 131,072 tokens in blocks of 512 the kernel's block table is int16 (its first operand): q is
    # its first floating operand, [64 heads, 16384 local queries, 128] against 131,072 keys
    text = SPLASH.replace(
        "operand_layout_constraints={", "operand_layout_constraints={s16[1,32,256]{2,1,0}, s8[1,32,256]{2,1,0}, "
    )
    flops = 2 * 2 * 8 * 2048 * 2048 * 128 / 2
    assert predict_step(text, TARGET, CAL).hardware_flops == flops


@pytest.mark.parametrize(
    "text", ["", "HloModule m\n", "not hlo at all", "HloModule m\nENTRY %e {\n ROOT %x = f32[] bogus(\n}\n"]
)
def test_text_that_is_not_a_module_is_a_plan_error(text):
    with pytest.raises(PlanError, match="Cannot predict a step time"):
        predict_step(text, TARGET, CAL)


def test_every_truncation_of_a_module_is_a_time_or_a_plan_error():
    """HLO text is untrusted input: a module cut anywhere gives a time or our error, never
    another exception, and never a negative time."""
    text = async_gather_around(dot_first=False)
    for end in range(0, len(text), 7):
        try:
            t = predict_step(text[:end], TARGET, CAL)
        except PlanError:
            continue
        assert t.seconds >= 0 and t.exposed_seconds >= 0


_B = "_blocks_512x1024_256x2048_128x512"


@pytest.mark.parametrize(
    ("op_name", "window"),
    [
        (f"jit(step)/while/body/scaled_dot_product_attention/splash_window_128{_B}/shard_map/pallas_call", 128),
        (f"jit(loss)/jvp(splash_window_1024{_B})/shard_map/pallas_call", 1024),  # JAX writes a transform around it
        (f"jit(loss)/transpose(jvp(splash_window_64{_B}))/pallas_call", 64),
        ("jit(step)/scaled_dot_product_attention/shard_map/pallas_call", None),
        (f"jit(step)/splash_window_12x{_B}/pallas_call", None),
        ("jit(step)/splash_window_12_blocks_512x512/pallas_call", None),  # three pairs of blocks, always
        ("jit(step)/splash_window_128/pallas_call", None),  # a scope with no blocks: none the planner writes
    ],
)
def test_a_kernel_s_window_is_read_from_its_scope(op_name, window):
    found = splash_window(op_name)
    assert (found.window if found else None) == window
    assert found is None or found.blocks == ((512, 1024), (256, 2048), (128, 512))
    assert found is None or found.blocks_of("fusion.3") is None  # not a splash kernel


@given(
    window=st.integers(1, 1 << 20),
    sizes=st.fixed_dictionaries({name: st.integers(1, 64).map(lambda n: 128 * n) for name in SIZE_NAMES}),
)
def test_a_window_scope_reads_back_as_written(window, sizes):
    found = splash_window(f"jit(step)/transpose(jvp({window_scope(window, sizes)}))/shard_map/pallas_call")
    assert found is not None and found.window == window
    assert found.blocks_of("splash_mha_fwd_residuals.3") == (sizes["q"], sizes["kv"])
    assert found.blocks_of("splash_mha_dkv_no_residuals.3") == (sizes["q_dkv"], sizes["kv_dkv"])
    assert found.blocks_of("splash_mha_dkv" + FUSED) == (sizes["q_dkv"], sizes["kv_dkv"])
    assert found.blocks_of(JAX07_FORWARD) == (sizes["q"], sizes["kv"])
    assert found.blocks_of("fusion.3") is None
    assert found.blocks_of("splash_mha_dq_no_residuals.3") == (sizes["q_dq"], sizes["kv_dq"])


@given(
    blocks=st.integers(1, 12),
    block_q=st.sampled_from((1, 2, 4, 8)),
    block_kv=st.sampled_from((1, 2, 4, 8)),
    window=st.integers(1, 40),
)
def test_blocked_pairs_are_the_blocks_the_mask_reaches_run_whole(blocks, block_q, block_kv, window):
    seq = blocks * block_q * block_kv  # both block sizes divide it
    seen = np.tril(np.ones((seq, seq), bool)) & ~np.tril(np.ones((seq, seq), bool), -window)
    run = seen.reshape(seq // block_q, block_q, seq // block_kv, block_kv).any(axis=(1, 3))
    counted = attended_pairs(seq, seq, window, (block_q, block_kv))
    assert counted == run.sum() * block_q * block_kv  # a window holding the sequence is causal: rounded too
    assert counted >= seen.sum()
    if window < seq:
        assert attended_pairs(seq, seq, window) == seen.sum()


def test_a_causal_kernel_runs_the_diagonal_s_blocks_whole():
    seq = 8192
    for n in (16, 64):  # n blocks a side: n (n + 1) / 2 pairs of blocks for the n^2 / 2 of half the square
        assert attended_pairs(seq, seq, None, (seq // n, seq // n)) / (seq * seq / 2) == pytest.approx((n + 1) / n)
    assert attended_pairs(seq, seq, None) == seq * seq / 2  # no blocks declared: the half
    # a context shard's queries beside other keys: where the diagonal falls is not in the shapes
    assert attended_pairs(1024, 4096, None, (512, 512)) == 1024 * 4096 / 2


def test_a_kernel_s_blocks_are_read_from_its_declaration_on_either_jax():
    jax012 = r'frontend_attributes={kernel_metadata={"xprof_metadata":"{\"block_q\": 1024, \"block_kv\": 512, \"block_q_dkv\": 2048, \"block_kv_dkv\": 256, \"block_q_dq\": 128, \"block_kv_dq\": 64}"}}'
    assert declared_blocks("splash_mha_fwd_residuals.3", jax012) == (1024, 512)
    assert declared_blocks("splash_mha_dkv_no_residuals.1", jax012) == (2048, 256)
    assert declared_blocks("splash_mha_dq_no_residuals.1", jax012) == (128, 64)
    assert declared_blocks(JAX07_FORWARD, "") == (256, 128)
    assert declared_blocks("splash_mha_dq_block_kv_dq_128_block_q_dq_512.4", "") == (512, 128)
    assert declared_blocks("splash_mha_fwd_residuals.3", "") is None  # declares none
    assert declared_blocks("fusion.3", jax012) is None  # not a splash kernel


def test_gemma3_s_window_over_maxtext_s_blocks_runs_two_to_three_times_its_pairs():
    seq, window = 32768, 1024
    exact = attended_pairs(seq, seq, window)
    assert attended_pairs(seq, seq, window, (1024, 1024)) / exact == pytest.approx(2.0, abs=1e-3)  # forward, dq
    assert attended_pairs(seq, seq, window, (512, 2048)) / exact == pytest.approx(2.984, abs=1e-3)  # dkv
    assert attended_pairs(seq, seq, window, (512, 512)) / exact == pytest.approx(1.5, abs=1e-3)  # the planner's


def test_a_kernel_named_with_its_block_sizes_is_costed_by_its_pass():
    assert splash_phase(JAX07_FORWARD) == "fwd" and splash_matmuls(JAX07_FORWARD) == 2
    assert splash_head_dim_matmuls(JAX07_FORWARD) == 1
    assert splash_phase("splash_mha_dq_block_kv_dq_128_block_q_dq_512.4") == "dq"
    assert splash_phase("splash_mqa_dkv_segmented_block_kv_dkv_256.1") == "dkv"
    assert splash_phase("splash_mha_fwdx") is None and splash_phase("fusion.splash_mha_fwd") is None


def test_attended_pairs_count_each_query_s_keys():
    assert attended_pairs(1024, 1024, None) == 1024 * 1024 / 2
    assert attended_pairs(1024, 1024, 2048) == 1024 * 1024 / 2  # a window holding the sequence
    # each of 8 queries sees up to its last 3 keys: 1 + 2 + 3 x 6
    assert attended_pairs(8, 8, 3) == 1 + 2 + 3 * 6
