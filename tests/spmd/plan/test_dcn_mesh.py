"""FSDP across slices (`spmd.plan.request.dcn`): ``dcn_fsdp=2,fsdp=4`` on 2 slices of v5e:2x2 shards the
parameters over all 8 devices (MaxText's ``dcn_fsdp_parallelism``), where data parallelism over
DCN (``data=2,fsdp=4``) shards them over each slice's 4; the fsdp axis runs over slice 0's
devices, then slice 1's (jax's hybrid mesh). The compile runs in a process of its own; the
mesh's arithmetic and errors need none."""

import pytest

from spmd.plan import PlanError
from spmd.plan.request.dcn import split_dcn
from tests.spmd.plan.child_compile import on_demand_on_torch_xla, python_code

LLAMA = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 640, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}  # fmt: skip
BATCH, SEQ = 16, 256

COMPILE = """
import json, sys
from spmd.plan import plan
from spmd.plan.api import _request
from spmd.plan.request.meshes import build_mesh, tpu_devices
from spmd.plan.request.settings import PlanSettings

config = sys.argv[1]
settings = PlanSettings("v5e:2x2", 2, 256)
req = _request(settings, "fsdp", {"dcn_fsdp": 2, "fsdp": 4}, 16, "dots", 4)
devices = tpu_devices(req.target)
mesh = build_mesh(req.mesh, req.target, devices, req.dcn)
slices = [devices[i].slice_index for i in mesh.get_logical_mesh().reshape(-1)]
out = {"slices": slices}
for name, shape in (("dcn_fsdp", {"dcn_fsdp": 2, "fsdp": 4}), ("dcn_data", {"data": 2, "fsdp": 4})):
    r = plan(config, "v5e:2x2", slices=2, mesh=shape, global_batch=16, seq_len=256)
    out[name] = {"mesh": r.mesh, "dcn": r.dcn_mesh, "arguments": r.memory.argument_bytes,
                 "predicted": r.memory.predicted_argument_bytes, "fits": r.fits,
                 "dcn_bytes": sum(c.dcn_bytes_sent_per_chip for c in r.collectives), "table": r.table()}
print(json.dumps(out))
"""


def n_params() -> int:
    h, i, v, layers = 256, 640, 1024, 2
    return 2 * v * h + layers * (4 * h * h + 3 * h * i + 2 * h) + h


ACROSS_SLICES = python_code(COMPILE, LLAMA, timeout=1800)


@pytest.mark.reads(ACROSS_SLICES)
@on_demand_on_torch_xla
def test_fsdp_across_slices_shards_the_parameters_over_every_device():
    out = ACROSS_SLICES.result()
    assert out["slices"] == [0, 0, 0, 0, 1, 1, 1, 1]
    across, data = out["dcn_fsdp"], out["dcn_data"]
    assert (across["mesh"], across["dcn"]) == ({"fsdp": 8}, {"fsdp": 2})
    assert (data["mesh"], data["dcn"]) == ({"data": 2, "fsdp": 4}, {"data": 2})
    tokens = 4 * BATCH * SEQ // 8  # int32, split over the 8 batch shards either way
    state = 3 * 4 * n_params()  # fp32 parameters and AdamW's two moments
    assert across["predicted"] == state // 8 + tokens  # our sharding math
    assert data["predicted"] == state // 4 + tokens
    # the compiler's, padded to the TPU's tiles (the norms' 256 split 8 ways is 32 a device): 0.2 % more
    assert across["predicted"] <= across["arguments"] < 1.01 * across["predicted"]
    assert data["predicted"] <= data["arguments"] < 1.01 * data["predicted"]
    assert across["fits"] and data["fits"]
    assert across["dcn_bytes"] > 0 and data["dcn_bytes"] > 0  # both send between slices
    assert "mesh fsdp=8 (across slices: fsdp=2)" in across["table"]
    # the predicted step names the part the slices' waits add (the calibration's slice term)
    assert "ms the 2 slices' waits for each other" in across["table"]


@pytest.mark.parametrize(
    ("mesh", "slices", "shape", "dcn"),
    [
        ({"dcn_fsdp": 2, "fsdp": 64, "tensor": 4}, 2, {"fsdp": 128, "tensor": 4}, {"fsdp": 2}),
        ({"dcn_data": 2, "fsdp": 256}, 2, {"data": 2, "fsdp": 256}, {"data": 2}),
        ({"fsdp": 8, "dcn_data": 2, "dcn_fsdp": 2}, 4, {"fsdp": 16, "data": 2}, {"data": 2, "fsdp": 2}),
        ({"data": 4, "fsdp": 8}, 2, {"data": 4, "fsdp": 8}, {"data": 2}),
        ({"fsdp": 8}, 1, {"fsdp": 8}, {}),
    ],
)
def test_dcn_sizes_multiply_into_their_axes(mesh, slices, shape, dcn):
    assert split_dcn(mesh, slices) == (shape, dcn)


@pytest.mark.parametrize(
    ("mesh", "slices", "says"),
    [
        ({"dcn_fsdp": 2, "fsdp": 4}, 4, "multiply to 2, and the slice count is 4"),
        ({"dcn_model": 2, "fsdp": 4}, 2, "the axes that can span slices"),
        ({"fsdp": 8}, 2, "dcn_fsdp=2"),
    ],
)
def test_a_mesh_that_cannot_span_the_slices_is_refused(mesh, slices, says):
    with pytest.raises(PlanError, match=says):
        split_dcn(mesh, slices)


def test_the_advisor_tries_fsdp_over_dcn_beside_data_parallelism_over_dcn():
    from spmd.plan.advisor.advisor import candidates_for
    from spmd.plan.request.topology import parse_slice

    two = parse_slice("v6e-256", 2)
    meshes = candidates_for(two, ["fsdp", "2d"], [4], 64)
    assert meshes == [
        ("fsdp", {"data": 2, "fsdp": 256}),
        ("fsdp", {"dcn_fsdp": 2, "fsdp": 256}),
        ("2d", {"data": 2, "fsdp": 64, "tensor": 4}),
        ("2d", {"dcn_fsdp": 2, "fsdp": 64, "tensor": 4}),
    ]
    assert all("dcn_fsdp" not in m for _, m in candidates_for(parse_slice("v6e-256"), ["fsdp", "2d"], [4], 64))


def test_a_candidate_across_slices_counts_its_whole_axes_and_writes_a_hybrid_mesh():
    from types import SimpleNamespace

    from spmd.plan.advisor.advice import Candidate, _mesh_lines

    c = Candidate("2d", (("dcn_fsdp", 2), ("fsdp", 64), ("tensor", 4)), 2, "dots")
    assert c.whole_mesh == {"fsdp": 128, "tensor": 4}
    assert c.global_batch == 2 * 128  # sequences per batch shard x the fsdp shards of both slices
    _, line = _mesh_lines(SimpleNamespace(slices=2), c.mesh_shape)  # type: ignore[arg-type]
    assert line == "mesh = HybridMesh(ici_mesh_shape=(64, 4), dcn_mesh_shape=(2, 1), axis_names=('fsdp', 'tensor'))"
    _, line = _mesh_lines(SimpleNamespace(slices=2), {"data": 2, "fsdp": 256})  # type: ignore[arg-type]
    assert line == "mesh = HybridMesh(ici_mesh_shape=(1, 256), dcn_mesh_shape=(2, 1), axis_names=('data', 'fsdp'))"
