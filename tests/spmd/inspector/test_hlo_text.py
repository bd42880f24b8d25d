"""The HLO text reader: shapes, instructions, attributes, metadata, parameter tracing."""

import pytest

from spmd.inspector.hlo_text import ArrayShape, HloModuleText, parse_shape

# Abridged from a real torch_xla 2.9 CPU dump (x[64,32] P(None,'x') @ w[32,16] P('x',None)),
# plus an optimization barrier and a fused convert the way fsdp_xla's graphs have them.
MODULE = """\
HloModule SyncTensorsGraph.5, is_scheduled=true, entry_computation_layout={(f32[4,16]{1,0}, f32[64,4]{1,0})->(f32[64,16]{1,0})}, allow_spmd_sharding_propagation_to_output={true}, num_partitions=8

%add.clone (x.1: f32[], y.1: f32[]) -> f32[] {
  %x.1 = f32[] parameter(0)
  %y.1 = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x.1, %y.1)
}

%fused_convert (param_0: f32[4,16]) -> bf16[4,16] {
  %param_0 = f32[4,16]{1,0} parameter(0)
  ROOT %convert.1 = bf16[4,16]{1,0} convert(%param_0)
}

ENTRY %SyncTensorsGraph.5_spmd (param.1: f32[4,16], param: f32[64,4]) -> (f32[64,16]) {
  %param = f32[64,4]{1,0} parameter(1), sharding={devices=[1,8]0,1,2,3,4,5,6,7}, metadata={op_type="xla__device_data" op_name="M.1/layers.0.2/xla__device_data" source_file="/x/t.py" source_line=14}
  %param.1 = f32[4,16]{1,0} parameter(0), sharding={devices=[8,1]0,1,2,3,4,5,6,7}
  %tuple.0 = (f32[4,16]{1,0}, f32[64,4]{1,0}) tuple(%param.1, %param)
  %opt-barrier = (f32[4,16]{1,0}, f32[64,4]{1,0}) opt-barrier(%tuple.0)
  %gte = f32[4,16]{1,0} get-tuple-element(%opt-barrier), index=0
  %cv = bf16[4,16]{1,0} fusion(%gte), kind=kLoop, calls=%fused_convert
  %ag = bf16[32,16]{1,0} all-gather(%cv), channel_id=2, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %dot = f32[64,16]{1,0} dot(%param, %param.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_type="aten__mm" op_name="aten__mm" source_file="/x/t.py" source_line=14}
  %all-reduce = f32[64,16]{1,0} all-reduce(%dot), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add.clone, metadata={op_type="aten__mm" op_name="aten__mm" source_file="/x/t.py" source_line=14}
  ROOT %tuple = (f32[64,16]{1,0}) tuple(%all-reduce)
}
"""


def test_parse_shape_arrays_and_tuples():
    assert parse_shape("f32[64,16]{1,0}") == (ArrayShape("f32", (64, 16)),)
    assert parse_shape("f32[]") == (ArrayShape("f32", ()),)
    assert parse_shape("(bf16[4]{0}, /*index=1*/s32[2,3]{1,0})") == (
        ArrayShape("bf16", (4,)),
        ArrayShape("s32", (2, 3)),
    )
    assert ArrayShape("bf16", (4, 8)).nbytes == 64
    assert ArrayShape("f32", ()).nbytes == 4
    assert str(ArrayShape("f32", (64, 16))) == "f32[64,16]"


def test_module_header_and_computations():
    m = HloModuleText.parse(MODULE)
    assert m.name == "SyncTensorsGraph.5"
    assert m.num_partitions == 8
    assert m.entry == "SyncTensorsGraph.5_spmd"
    assert set(m.computations) == {"add.clone", "fused_convert", "SyncTensorsGraph.5_spmd"}
    assert [i.opcode for i in m.entry_instructions][-1] == "tuple"
    assert m.entry_instructions[-1].is_root


def test_parameters_sharding_and_metadata():
    m = HloModuleText.parse(MODULE)
    params = m.parameters()
    assert sorted(params) == [0, 1]
    assert params[1].arrays == (ArrayShape("f32", (64, 4)),)
    assert params[1].sharding == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    assert params[1].metadata == {
        "op_type": "xla__device_data",
        "op_name": "M.1/layers.0.2/xla__device_data",
        "source_file": "/x/t.py",
        "source_line": "14",
    }
    assert params[0].metadata == {}


def test_attributes_balanced_and_plain():
    m = HloModuleText.parse(MODULE)
    ar = next(i for i in m.entry_instructions if i.opcode == "all-reduce")
    assert ar.attribute("replica_groups") == "{{0,1,2,3,4,5,6,7}}"
    assert ar.attribute("channel_id") == "1"
    assert ar.attribute("to_apply") == "%add.clone"
    assert ar.operands == ("dot",)
    ag = next(i for i in m.entry_instructions if i.opcode == "all-gather")
    assert ag.attribute("replica_groups") == "[1,8]<=[8]"
    assert ag.attribute("dimensions") == "{0}"
    assert ag.attribute("missing") is None


def test_source_parameter_follows_barrier_tuple_and_fusion():
    m = HloModuleText.parse(MODULE)
    by_name = {i.name: i for i in m.entry_instructions}
    assert m.source_parameter(by_name["cv"]) == 0
    assert m.source_parameter(by_name["gte"]) == 0
    assert m.source_parameter(by_name["dot"]) is None  # two inputs: computed


def test_not_a_module():
    with pytest.raises(TypeError, match="takes the dump's text \\(a str\\), got NoneType"):
        HloModuleText.parse(None)
    with pytest.raises(ValueError, match="no 'HloModule' line"):
        HloModuleText.parse("hello")
    with pytest.raises(ValueError, match="no ENTRY"):
        HloModuleText.parse("HloModule m\n\n%c (a: f32[]) -> f32[] {\n  ROOT %a = f32[] parameter(0)\n}\n")


# A Pallas kernel's backend_config can hold newlines (libtpu 0.0.52's splash attention does), and
# a computation on the SparseCore thread ends with '}, execution_thread="sparsecore"'.
MULTILINE = """HloModule jit_step, num_partitions=2

%offloaded (p: f32[4]) -> f32[4] {
  ROOT %p = f32[4]{0} parameter(0)
}, execution_thread="sparsecore"

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %kernel = f32[4]{0} custom-call(%x), custom_call_target="tpu_custom_call", backend_config={"custom_call_config": {"xprof":"{\\"block_q\\": 512,
"block_kv": 512}"
}}, metadata={op_name="splash"}
  ROOT %after = f32[4]{0} add(%kernel, %x)
}
"""


def test_instructions_spanning_lines_and_thread_computations_are_read():
    module = HloModuleText.parse(MULTILINE)
    assert set(module.computations) == {"offloaded", "main"}
    names = [i.name for i in module.entry_instructions]
    assert names == ["x", "kernel", "after"]
    kernel = module.by_name["kernel"]
    assert kernel.metadata["op_name"] == "splash" and '"block_kv": 512' in kernel.attributes
