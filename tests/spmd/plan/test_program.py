"""Reading collectives from TPU HLO text (pure): all-reduces that implement gathers, and the
multi-slice runtime's transfers between slices."""

from spmd.plan.compile.program import step_collectives

# The shape of what libtpu emits on v5p for an FSDP gather (trimmed from a real compile): each
# device writes its shard into zeros, and an all-reduce sums the shards into the full array.
HLO = """HloModule jit_step, is_scheduled=true, num_partitions=8

%add (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %sum = bf16[] add(%a, %b)
}

ENTRY %main (shard: bf16[64], grad: bf16[512], i: s32[]) -> (bf16[512], bf16[512]) {
  %shard = bf16[64]{0} parameter(0)
  %grad = bf16[512]{0} parameter(1)
  %i = s32[] parameter(2)
  %zero = bf16[] constant(0)
  %zeros = bf16[512]{0} broadcast(%zero), dimensions={}
  %placed = bf16[512]{0} dynamic-update-slice(%zeros, %shard, %i)
  %gathered = bf16[512]{0} all-reduce(%placed), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %reduced = bf16[512]{0} all-reduce(%grad), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  ROOT %out = (bf16[512]{0}, bf16[512]{0}) tuple(%gathered, %reduced)
}
"""


def test_an_all_reduce_of_shards_written_into_zeros_is_a_gather():
    found = {c.name: c for c in step_collectives(HLO)}
    assert found["gathered"].implements == "all-gather"
    assert found["reduced"].implements == ""
    assert {c.kind.value for c in found.values()} == {"all-reduce"}
    assert found["gathered"].result_bytes == 1024 and found["gathered"].group_size == 8


# A multi-slice compile (trimmed from libtpu's for v5e:2x2 x 2 slices): the all-reduce across
# slices is a host-transfer send/recv pair to the multi-slice runtime, inside a 3-step loop.
DCN_HLO = """HloModule jit_step, is_scheduled=true, num_partitions=4

%cond (p: (s32[], f32[128])) -> pred[] {
  %p = (s32[], f32[128]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %three = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %three), direction=LT
}

%body (p: (s32[], f32[128])) -> (s32[], f32[128]) {
  %p = (s32[], f32[128]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[128]{0} get-tuple-element(%p), index=1
  %token = token[] after-all()
  %send = (f32[1,1,128]{2,1,0}, u32[], token[]) send(%x, %token), channel_id=120, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_megascale_reduce_operation="SUM",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %recv = (f32[1,1,128]{2,1,0}, u32[], token[]) recv(%token), channel_id=121, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_megascale_reduce_operation="SUM",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[128]{0}) tuple(%next, %x)
}

ENTRY %main (x: f32[128]) -> f32[128] {
  %x = f32[128]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[128]{0}) tuple(%zero, %x)
  %loop = (s32[], f32[128]{0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[128]{0} get-tuple-element(%loop), index=1
}
"""


def test_transfers_between_slices_are_dcn_collectives_over_the_slices():
    (dcn,) = step_collectives(DCN_HLO)
    assert dcn.over_dcn and dcn.kind.value == "all-reduce"
    assert (dcn.group_size, dcn.count, dcn.result_bytes) == (2, 3, 512)
    assert dcn.bytes_sent_per_device == 3 * 512  # a 2-member ring sends each all-reduce's bytes once


# What libtpu 0.0.52 emits on tpu7x (trimmed from a compile): Shardy's named-axis replica groups,
# and an FSDP gather offloaded to the SparseCore, an async computation on its own thread (closed
# by '}, execution_thread=...') whose custom call runs the all-gather.
SPARSECORE_HLO = """HloModule jit_step, is_scheduled=true, num_partitions=8

%called_computation.46 (param_0.1418: bf16[128,512]) -> bf16[1024,512] {
  %param_0.1418 = bf16[128,512]{1,0} parameter(0)
  ROOT %all-gather.149 = bf16[1024,512]{1,0} all-gather(%param_0.1418), channel_id=54, replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0','axis_1'}, dimensions={0}, use_global_device_ids=true
}, execution_thread="sparsecore"

%async_computation.14 (param_0.1394: bf16[128,512]) -> bf16[1024,512] {
  %param_0.1394 = bf16[128,512]{1,0} parameter(0)
  ROOT %custom-call.33 = bf16[1024,512]{1,0} custom-call(%param_0.1394), custom_call_target="TODO(b/522284627)", called_computations={%called_computation.46}
}, execution_thread="sparsecore"

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

ENTRY %main (shard: bf16[128,512], g: f32[256]) -> (bf16[1024,512], f32[256]) {
  %shard = bf16[128,512]{1,0} parameter(0)
  %g = f32[256]{0} parameter(1)
  %start = ((bf16[128,512]{1,0}), bf16[1024,512]{1,0}, u32[]) async-start(%shard), async_execution_thread="sparsecore", calls=%async_computation.14
  %done = bf16[1024,512]{1,0} async-done(%start)
  %reduced = f32[256]{0} all-reduce(%g), channel_id=2, replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, use_global_device_ids=true, to_apply=%add
  ROOT %out = (bf16[1024,512]{1,0}, f32[256]{0}) tuple(%done, %reduced)
}
"""


def test_sparsecore_collectives_and_named_axis_groups_are_read():
    found = {c.name: c for c in step_collectives(SPARSECORE_HLO)}
    assert set(found) == {"all-gather.149", "reduced"}
    gather, reduce = found["all-gather.149"], found["reduced"]
    assert (gather.kind.value, gather.result_bytes, gather.group_size) == ("all-gather", 1024 * 512 * 2, 8)
    assert gather.bytes_sent_per_device == 1024 * 512 * 2 * 7 // 8
    # {'axis_1'} on a 4 x 2 mesh: pairs of neighbours.
    assert (reduce.group, reduce.group_size) == ((0, 1), 2)
    assert reduce.bytes_sent_per_device == 2 * 1024 * 1 // 2
