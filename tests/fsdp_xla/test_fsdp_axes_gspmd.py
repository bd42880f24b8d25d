"""FSDP over several mesh axes, and HSDP, on GSPMD (8 virtual devices): numerics against eager
single-device training, each device's stored share, the replicas' equality, the collectives of
a compiled step (fsdp_xla.communication), and checkpoints moved between layouts.

The meshes are the 8-device forms of the 4-rank ones the dtensor tests use: ``fsdp x context``
4 x 2 (the batch split over ``fsdp``, the sequence over ``context``), HSDP ``data x fsdp`` 2 x 4,
and both at once, ``data x fsdp x context`` 2 x 2 x 2 (a 2 x 2 shard group, each device a quarter).
"""

import copy

import numpy as np
import pytest
import torch

from fsdp_xla import FSDP, FSDPError, transformer_auto_wrap_policy
from fsdp_xla.checkpoint import checkpoint_version, load_sharded, save_sharded
from mesh import Mesh
from spmd import P, mark_sharding
from spmd.sharded_tensor import wrap_as_sharded_tensor
from tests.fsdp_xla.helpers import GPT, SMALL, Block, batches, lm_loss

FSDP_CONTEXT = Mesh(np.arange(8), (4, 2), ("fsdp", "context"))
HSDP = Mesh(np.arange(8), (2, 4), ("data", "fsdp"))
HSDP_CONTEXT = Mesh(np.arange(8), (2, 2, 2), ("data", "fsdp", "context"))
FSDP8 = Mesh(np.arange(8), (8,), ("fsdp",))
# How each mesh splits the inputs: the batch over the data-parallel axes, the sequence over context.
INPUTS = {
    FSDP_CONTEXT: P("fsdp", "context"),
    HSDP: P(("data", "fsdp"), None),
    HSDP_CONTEXT: P(("data", "fsdp"), "context"),
    FSDP8: P("fsdp", None),
}


@pytest.fixture(scope="module")
def reference():
    """4 AdamW steps of the model, eager on the CPU (one device), and its first gradients."""
    torch.manual_seed(0)
    start = GPT(**SMALL)
    model, data = copy.deepcopy(start), batches(4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, grads = [], None
    for i, tokens in enumerate(data):
        loss = lm_loss(model(tokens[:, :-1]), tokens)
        loss.backward()
        if i == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return start, data, losses, grads


def step(model, optimizer, tokens, mesh, device, grads=False):
    """One AdamW step on the global batch, split as `INPUTS` says: (loss, gradients or None)."""
    import torch_xla

    inputs, targets = tokens[:, :-1].contiguous().to(device), tokens.to(device)
    mark_sharding(inputs, mesh, INPUTS[mesh])
    mark_sharding(targets, mesh, P(INPUTS[mesh][0], None))
    loss = lm_loss(model(inputs), targets)
    loss.backward()
    full = {n: p.grad.cpu() for n, p in model.named_parameters()} if grads else None
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()
    return loss.item(), full


def wrapped(start, mesh, **options):
    return FSDP(copy.deepcopy(start), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}), **options)


def rel_error(got, want):
    return max((got[k] - v).abs().max().item() / v.abs().max().item() for k, v in want.items())


def blocks(p):
    """Each device's block of ``p`` on the host, by device id."""
    return {s.device: s.unpadded_data.cpu() for s in wrap_as_sharded_tensor(p).local_shards}


@pytest.mark.parametrize(
    "mesh, spec, share",
    [
        (FSDP_CONTEXT, P(("fsdp", "context"), None), 1 / 8),
        (HSDP, P("fsdp", None), 1 / 4),
        (HSDP_CONTEXT, P(("fsdp", "context"), None), 1 / 4),
    ],
)
def test_training_equals_single_device_and_each_device_stores_its_share(xla, reference, mesh, spec, share):
    start, data, ref_losses, ref_grads = reference
    model = wrapped(start, mesh)  # the mesh's roles: shard over fsdp (and context), replicate over data
    assert model.fsdp_param_specs()["h.0.c_fc.weight"] == spec  # [256, 64]: the axes together on dim 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    runs = [step(model, optimizer, tokens, mesh, xla, grads=i == 0) for i, tokens in enumerate(data)]
    torch.testing.assert_close(torch.tensor([r[0] for r in runs]), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    assert rel_error(runs[0][1], ref_grads) <= 1e-5
    for name, p in model.named_parameters():
        assert {b.numel() / p.numel() for b in blocks(p).values()} == {share}, name
        if "data" in mesh.axis_names:  # the data axis is outermost: device d and d + 4 are replicas
            held = blocks(p)
            assert all(torch.equal(held[d], held[d + 4]) for d in range(4)), name


def test_hsdp_step_gathers_over_fsdp_and_reduces_over_data_and_fsdp(xla, reference):
    """The compiled step's collectives (XLA:CPU): gathers within each fsdp group, and each
    gradient reduced over both axes its partial sums span, as one all-reduce over the 8 devices
    followed by the slice of the shard (XLA:CPU has no reduce-scatter; FSDP2 reduce-scatters over
    fsdp and all-reduces over data, tests/fsdp_xla/test_fsdp_axes_dtensor.py)."""
    from fsdp_xla.communication import Phase, attribute
    from spmd.inspector import CollectiveKind, capture

    _, data, _, _ = reference
    torch.manual_seed(0)
    model = wrapped(GPT(**dict(SMALL, n_layer=2)), HSDP)  # a graph not compiled before: captured
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with capture(ignore=["parameter-all-gather", "replicated-argument", "replicated-activation"]) as report:
        step(model, optimizer, data[0], HSDP, xla)
    records = attribute(report.graphs)
    fsdp_groups, everything = ((0, 1, 2, 3), (4, 5, 6, 7)), (tuple(range(8)),)
    gathers = {r.replica_groups for r in records if r.phase in (Phase.FORWARD_GATHER, Phase.BACKWARD_GATHER)}
    assert gathers == {fsdp_groups}
    reductions = [r for r in records if r.phase is Phase.GRADIENT_REDUCTION]
    assert reductions and {(r.kind, r.replica_groups) for r in reductions} == {(CollectiveKind.ALL_REDUCE, everything)}


def train(model, optimizer, data, mesh, device):
    return [step(model, optimizer, tokens, mesh, device)[0] for tokens in data]


def test_a_checkpoint_moves_between_layouts(xla, reference, tmp_path):
    """Saved by fsdp 8 after two steps, loaded into fsdp x context, HSDP and both; saved again by
    HSDP (one copy of each replicated block) and loaded into fsdp 8: each continues with the
    uninterrupted losses."""
    start, data, _, _ = reference
    model = wrapped(start, FSDP8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, optimizer, data[:2], FSDP8, xla)
    save_sharded(tmp_path / "fsdp8", model, optimizer, extra={"steps": 2})
    uninterrupted = train(model, optimizer, data[2:], FSDP8, xla)
    for mesh in (FSDP_CONTEXT, HSDP, HSDP_CONTEXT):
        other = wrapped(GPT(**SMALL), mesh)
        other_opt = torch.optim.AdamW(other.parameters(), lr=1e-3)
        assert load_sharded(tmp_path / "fsdp8", other, other_opt) == {"steps": 2}
        if mesh is HSDP:
            save_sharded(tmp_path / "hsdp", other, other_opt)
        assert train(other, other_opt, data[2:], mesh, xla) == pytest.approx(uninterrupted, rel=1e-5), mesh
    files = sorted(p.name for p in checkpoint_version(tmp_path / "hsdp").glob("*.safetensors"))
    assert files == [f"device-{d:05d}.safetensors" for d in range(4)]  # replicas 4..7 write nothing
    back = wrapped(GPT(**SMALL), FSDP8)
    back_opt = torch.optim.AdamW(back.parameters(), lr=1e-3)
    load_sharded(tmp_path / "hsdp", back, back_opt)
    assert train(back, back_opt, data[2:], FSDP8, xla) == pytest.approx(uninterrupted, rel=1e-5)


def test_a_spec_fn_may_put_the_axes_on_any_dim(xla, reference):
    """``param_spec_fn`` names the shard axes as one entry, here on the weights' second dim: stored
    so, gathered without them, trained as on one device."""
    start, data, ref_losses, _ = reference

    def spec(name, p):
        return P(None, ("fsdp", "context")) if p.dim() == 2 else P(("fsdp", "context"))

    model = wrapped(start, FSDP_CONTEXT, param_spec_fn=spec)
    assert model.fsdp_param_specs()["h.0.c_fc.weight"] == P(None, ("fsdp", "context"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert step(model, optimizer, data[0], FSDP_CONTEXT, xla)[0] == pytest.approx(ref_losses[0], rel=1e-5)
    (block,) = {b.shape for b in blocks(model.h[0].c_fc.weight).values()}
    assert block == (256, 64 // 8)


def test_a_spec_splitting_a_parameter_over_the_replicate_axis_is_refused(xla):
    model = GPT(**SMALL)
    with pytest.raises(FSDPError, match=r"splits it over 'data', a replicate axis .* fsdp_axis=\('fsdp', 'data'\)"):
        FSDP(model, mesh=HSDP, param_spec_fn=lambda name, p: P(("fsdp", "data")))
    assert type(model) is GPT and all(p.device.type == "cpu" for p in model.parameters())  # untouched
