"""make_global_tensor / make_global_batch / ProcessDataLoader on torch_xla: one process holding 8
devices (the whole batch is this process's rows), and hosts of 2 or 4 devices simulated by
assembling the blocks each host's local data gives through the backend's `from_local_blocks`.
The dtensor backend's 4-process runs are in tests/test_multiprocess.py."""

import numpy as np
import pytest
import torch

from mesh import Mesh
from spmd import (
    MissingSpecError,
    P,
    ProcessDataLoader,
    SpmdTypeError,
    get_sharding,
    hlo_sharding_for,
    make_global_batch,
    make_global_tensor,
    mark_sharding,
    process_rows,
)
from spmd._backend import backend_for
from spmd.multiprocess._process_layout import ProcessLayout
from spmd.sharding._named_sharding import NamedSharding

MESH = Mesh(np.arange(8), (4, 2), ("data", "model"))


def test_one_process_passes_the_whole_batch(xla):
    local = torch.arange(16 * 6, dtype=torch.float32).reshape(16, 6)
    out = make_global_tensor(local, MESH, P("data", "model"))
    reference = mark_sharding(local.to(xla), MESH, P("data", "model"))
    assert get_sharding(out) == get_sharding(reference)
    assert torch.equal(out.cpu(), local)
    assert process_rows(MESH, P("data"), 16) == list(range(16))


def test_uneven_and_replicated_layouts(xla):
    local = torch.arange(10 * 3).reshape(10, 3)  # 10 rows over 4 'data' blocks: GSPMD pads the last
    out = make_global_tensor(local, MESH, P("data"))
    assert torch.equal(out.cpu(), local) and out.shape == (10, 3)
    assert torch.equal(make_global_tensor(local.numpy(), MESH, P()).cpu(), local)


@pytest.mark.parametrize("per_host", [2, 4])
@pytest.mark.parametrize("spec", [P("data"), P("data", "model"), P(("data", "model")), P(None, "data")])
def test_simulated_hosts_assemble_the_global_tensor(xla, per_host, spec):
    """Each simulated host's local data (its rows) gives its devices' blocks; all blocks together,
    given to torch_xla, make the global tensor."""
    full = torch.arange(16 * 8, dtype=torch.float32).reshape(16, 8)
    processes = tuple(d // per_host for d in range(8))
    hlo = hlo_sharding_for(MESH, spec, 2, (16, 8))
    blocks = {}
    for host in range(8 // per_host):
        layout = ProcessLayout(hlo, 2, processes, host, "test")
        local = full[np.ix_(layout.rows(0, 16), layout.rows(1, 8))]
        assert layout.global_shape(tuple(local.shape)) == (16, 8)
        blocks.update({d: local[s] for d, (s, _) in layout.blocks((16, 8), tuple(local.shape)).items()})
    assert sorted(blocks) == list(range(8))
    out = backend_for(None).from_local_blocks(blocks, NamedSharding(MESH, spec), hlo, (16, 8))
    assert torch.equal(out.cpu(), full)
    assert get_sharding(out) == hlo


def test_a_dict_batch_takes_a_spec_per_key(xla):
    batch = {"input_ids": torch.arange(32).reshape(8, 4), "labels": torch.ones(8, 4, dtype=torch.long)}
    out = make_global_batch(batch, MESH, {"input_ids": P("data", "model"), "labels": P("data"), "unused": P()})
    assert get_sharding(out["input_ids"]) == hlo_sharding_for(MESH, P("data", "model"), 2)
    assert get_sharding(out["labels"]) == hlo_sharding_for(MESH, P("data"), 2)
    assert all(torch.equal(out[k].cpu(), batch[k]) for k in batch)
    with pytest.raises(MissingSpecError, match=r"the batch's keys \['labels'\] have no spec; specs are given for"):
        make_global_batch(batch, MESH, {"input_ids": P("data")})


def test_bad_input_is_named(xla):
    with pytest.raises(SpmdTypeError, match=r"make_global_tensor: the local data must be a torch.Tensor"):
        make_global_tensor([1, 2], MESH, P("data"))
    with pytest.raises(SpmdTypeError, match=r"already on the XLA device; pass this process's rows as a host"):
        make_global_tensor(torch.ones(8, 2).to(xla), MESH, P("data"))
    with pytest.raises(SpmdTypeError, match=r"batch must be a dict of tensors"):
        make_global_batch(torch.ones(2), MESH, P())


def test_the_loader_gives_global_batches_and_resumes(xla):
    rows = [{"x": torch.full((3,), float(i)), "y": torch.tensor(i)} for i in range(40)]
    specs = {"x": P("data", None), "y": P("data")}
    loader = ProcessDataLoader(rows, 8, MESH, specs, seed=1)
    batches = [b["y"].cpu().tolist() for b in loader]
    assert len(batches) == 5 and sorted(sum(batches, [])) == list(range(40))
    again = ProcessDataLoader(rows, 8, MESH, specs, seed=1)
    first = next(iter(again))
    assert get_sharding(first["x"]) == hlo_sharding_for(MESH, P("data", None), 2)
    resumed = ProcessDataLoader(rows, 8, MESH, specs, seed=1)
    resumed.load_state_dict(again.state_dict())
    assert [b["y"].cpu().tolist() for b in resumed] == batches[1:]


@pytest.mark.parametrize(
    "call, said",
    [
        (lambda: process_rows(MESH, P("data"), 8, dim=-1), r"process_rows' dim must be a whole number >= 0 \(a dim"),
        (lambda: process_rows(MESH, P("data"), 8, dim=0.0), r"process_rows' dim must be a whole number"),
        (lambda: process_rows(MESH, P("data"), 8.5), r"process_rows' global_size must be a whole number"),
        (lambda: make_global_tensor(torch.ones(8, 2), MESH, P("data"), check="no"), r"check takes True or False"),
    ],
)
def test_dims_counts_and_flags_are_checked(call, said):
    with pytest.raises(SpmdTypeError, match=said):
        call()


def test_a_float_global_shape_is_refused_not_truncated(xla):
    with pytest.raises(SpmdTypeError, match=r"global_shape entry must be a whole number >= 0 \(a dim size\), got 8.5"):
        make_global_tensor(torch.ones(8, 2), MESH, P("data"), global_shape=(8.5, 2))


def test_check_false_warns_that_the_ranks_still_agree(xla):
    # One rank passing check=False used to skip the exchange the others made, and gloo aborted the job.
    local = torch.arange(16.0).reshape(8, 2)
    with pytest.warns(FutureWarning, match=r"make_global_tensor\(check=False\) no longer skips the ranks' agreement"):
        out = make_global_tensor(local, MESH, P("data"), check=False)
    assert torch.equal(out.cpu(), local)
    with pytest.warns(FutureWarning, match=r"make_global_batch\(check=False\)"):
        make_global_batch({"x": local}, MESH, P("data"), check=False)
