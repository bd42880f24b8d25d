"""Reading collectives from TPU HLO text (pure): all-reduces that implement gathers."""

from spmd.plan.program import step_collectives

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
