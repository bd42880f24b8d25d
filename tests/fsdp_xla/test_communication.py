"""Every collective of an FSDP step attributed to its unit and phase (fsdp_xla.communication).

The HLO tests read a hand-written graph (both lanes). The step test compiles one AdamW step of a
2-block GPT on 8 devices and pins what each unit sends: each parameter gathered once for the
forward, what backward reads gathered once more (but the root's, which the root keeps), each
gradient reduced once (twice for the tied embedding: XLA:CPU reduces each use's gradient, see
docs/fsdp.md), and nothing else but the loss's scalars.
"""

from pathlib import Path

import pytest
import torch

from fsdp_xla._gspmd_unit import BACKWARD_GRAPH_NAME
from fsdp_xla._phases import Phase, parse_scope, scope_name
from fsdp_xla.communication import attribute, bytes_by_phase, counts_by_unit, zero3_minimum_bytes
from spmd.inspector import CollectiveKind, GraphReport, HloModuleText
from spmd.inspector.collectives import collectives_of, module_scope

AG, AR = CollectiveKind.ALL_GATHER, CollectiveKind.ALL_REDUCE

# Abridged from an fsdp_xla step on XLA:CPU: a forward gather traced in its unit's scope; a
# gradient all-reduced where the matmul computed it, then sliced to the shard inside a parallel
# call (the slice carries the reduction's scope); the loss's normalizer all-reduced and broadcast
# into the logits' gradient, which is later reduced in a unit's scope too.
GRAPH = """\
HloModule FSDPForwardBackward.7, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%slice_fusion (p.0: f32[64,32], p.1: u32[]) -> f32[8,32] {
  %p.0 = f32[64,32]{1,0} parameter(0)
  %p.1 = u32[] parameter(1)
  ROOT %ds = f32[8,32]{1,0} dynamic-slice(%p.0, %p.1, %p.1), dynamic_slice_sizes={8,32}, \
metadata={op_type="xla__custom_sharding" op_name="fsdp__gradient-reduction__h.0.31/xla__custom_sharding"}
}

ENTRY %main (w: f32[8,32], x: f32[4,32], n: f32[]) -> (f32[8,32], f32[4,64]) {
  %w = f32[8,32]{1,0} parameter(0)
  %x = f32[4,32]{1,0} parameter(1)
  %n = f32[] parameter(2)
  %ag = f32[64,32]{1,0} all-gather(%w), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, \
use_global_device_ids=true, metadata={op_type="xla__custom_sharding" \
op_name="GPT.1/h.0.4/fsdp__forward-gather__h.0.7/xla__custom_sharding"}
  %y = f32[4,64]{1,0} dot(%x, %ag), lhs_contracting_dims={1}, rhs_contracting_dims={1}, \
metadata={op_type="aten__mm" op_name="GPT.1/h.0.4/aten__mm"}
  %loss = f32[] all-reduce(%n), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add, \
metadata={op_type="aten__nll_loss" op_name="aten__nll_loss"}
  %b = f32[4,64]{1,0} broadcast(%loss), dimensions={}, metadata={op_type="aten__div" op_name="aten__div"}
  %dy = f32[4,64]{1,0} multiply(%y, %b), metadata={op_type="aten__mul" op_name="aten__mul"}
  %dw = f32[64,32]{1,0} dot(%dy, %x), lhs_contracting_dims={0}, rhs_contracting_dims={0}, \
metadata={op_type="aten__mm" op_name="aten__mm"}
  %ar = f32[64,32]{1,0} all-reduce(%dw), channel_id=3, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add, \
metadata={op_type="aten__mm" op_name="aten__mm"}
  %pid = u32[] partition-id()
  %call = f32[8,32]{1,0} call(%ar, %pid), to_apply=%slice_fusion
  ROOT %out = (f32[8,32]{1,0}, f32[4,64]{1,0}) tuple(%call, %dy)
}
"""


def graph_from_text(tmp_path, text):
    path = tmp_path / "module_0000.FSDPForwardBackward.7.cpu_after_optimizations.txt"
    path.write_text(text)
    module = HloModuleText.parse(text)
    return GraphReport("FSDPForwardBackward.7", 0, 8, None, (), tuple(collectives_of(module)), str(path))


def test_scope_names_round_trip_and_leave_module_scopes_alone():
    assert parse_scope(scope_name(Phase.BACKWARD_GATHER, "model.layers.3")) == (Phase.BACKWARD_GATHER, "model.layers.3")
    assert parse_scope(scope_name(Phase.FORWARD_GATHER, "")) == (Phase.FORWARD_GATHER, "")
    assert parse_scope("h.0") is None and parse_scope("fsdp__unknown__h.0") is None
    # The inspector names modules by the innermost module scope, not by an FSDP scope inside it.
    assert module_scope("GPT.1/h.0.4/fsdp__forward-gather__h.0.7/xla__custom_sharding") == "h.0"


def test_attribute_reads_gathers_reductions_and_the_rest(tmp_path):
    records = attribute([graph_from_text(tmp_path, GRAPH)])
    by_name = {r.name: r for r in records}
    assert (by_name["ag"].phase, by_name["ag"].unit, by_name["ag"].kind) == (Phase.FORWARD_GATHER, "h.0", AG)
    # GSPMD reduces the gradient at the matmul; the slice reading it names the unit.
    assert (by_name["ar"].phase, by_name["ar"].unit, by_name["ar"].kind) == (Phase.GRADIENT_REDUCTION, "h.0", AR)
    # The loss's scalar feeds a larger tensor on its way to a reduction: it is not a gradient.
    assert (by_name["loss"].phase, by_name["loss"].unit) == (Phase.OTHER, None)
    assert by_name["ar"].replica_groups == (tuple(range(8)),)
    sent = bytes_by_phase(records)
    assert sent[Phase.FORWARD_GATHER] == 64 * 32 * 4 * 7 // 8
    assert sent[Phase.GRADIENT_REDUCTION] == 2 * 64 * 32 * 4 * 7 // 8  # an all-reduce: twice a reduce-scatter
    assert sent[Phase.BACKWARD_GATHER] == 0
    assert by_name["ar"].to_dict()["phase"] == "gradient-reduction"


def test_zero3_minimum():
    assert zero3_minimum_bytes(8 << 20, 8) == 3 * (7 << 20)
    assert zero3_minimum_bytes(100, 1) == 0


CONFIG = dict(vocab=128, d_model=64, n_head=4, n_layer=2, seq=16)


@pytest.fixture(scope="module")
def step_records():
    pytest.importorskip("torch_xla", reason="compiles an FSDP step with torch_xla")
    import torch_xla

    from fsdp_xla import FSDP, transformer_auto_wrap_policy
    from spmd import P, mark_sharding
    from spmd.inspector import capture
    from tests.fsdp_xla.helpers import GPT, Block, batches, fsdp_mesh, lm_loss

    mesh = fsdp_mesh()
    torch.manual_seed(0)
    model = FSDP(GPT(**CONFIG), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    (tokens,) = batches(1, batch=16, seq=CONFIG["seq"], vocab=CONFIG["vocab"], seed=3)
    with capture(ignore=["parameter-all-gather", "replicated-argument", "replicated-activation"]) as report:
        tokens = tokens.to(torch_xla.device())
        mark_sharding(tokens, mesh, P("fsdp", None))
        lm_loss(model(tokens[:, :-1]), tokens).backward()
        optimizer.step()
        torch_xla.sync()
    return attribute(report.graphs), model, report.graphs


def test_each_unit_gathers_twice_and_reduces_once(step_records):
    records, _, _ = step_records
    counts = counts_by_unit(records)
    assert set(counts) == {"", "h.0", "h.1", None}
    for block in ("h.0", "h.1"):
        assert counts[block] == {
            Phase.FORWARD_GATHER: {AG: 12},  # every parameter of the block
            Phase.BACKWARD_GATHER: {AG: 6},  # what backward reads: 4 linear weights, 2 LayerNorm weights
            Phase.GRADIENT_REDUCTION: {AR: 12},  # each gradient once (XLA:CPU: all-reduce + slice)
        }, block
    assert counts[""] == {
        Phase.FORWARD_GATHER: {AG: 4},  # wte (= lm_head), wpe, ln_f weight and bias
        # No backward gather: the root keeps its forward copies (its backward begins at once).
        Phase.GRADIENT_REDUCTION: {AR: 5},  # the tied wte's two uses reduced apart, then summed
    }
    others = [r for r in records if r.phase is Phase.OTHER]
    assert others and all(r.kind is AR and r.shape == "f32[]" for r in others), others  # the loss's scalars


def test_forward_gathers_send_each_parameter_once(step_records):
    records, model, _ = step_records
    expected = sum(p.numel() * p.element_size() * 7 // 8 for p in model.parameters())
    assert bytes_by_phase(records)[Phase.FORWARD_GATHER] == expected


def test_libtpu_reduces_the_same_gradients_with_reduce_scatters(step_records):
    """XLA:CPU's all-reduce + slice is the CPU compiler's doing: libtpu, compiling the very graph
    for a v5e-8, reduce-scatters the weight gradients (docs/fsdp.md)."""
    pytest.importorskip("libtpu", reason="compiles for a TPU with libtpu")
    from spmd.plan.compile.recompile import tpu_step_collectives

    records, model, graphs = step_records
    (graph,) = [g for g in graphs if g.name.startswith(BACKWARD_GRAPH_NAME)]
    reductions = [r for r in records if r.phase is Phase.GRADIENT_REDUCTION]
    assert {r.kind for r in reductions} == {AR}  # on the CPU
    on_tpu = tpu_step_collectives(Path(graph.hlo_path), 8)
    scattered = [c for c in on_tpu if c.kind is CollectiveKind.REDUCE_SCATTER]
    # Every block weight's gradient arrives as its shard: the reduce-scatters' results hold them.
    blocks = sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if n.startswith("h.") and p.dim() == 2
    )
    assert sum(c.result_bytes for c in scattered) >= blocks // 8
