"""fsdp_axis and replicate_axis (fsdp_xla._axes): several shard axes as one, in mesh order; the
defaults derived from the mesh's roles; HSDP's replicate axes; and refusals, each a typed error
naming the fix that leaves the model as it was. No devices: the options are checked when built,
and the dtensor backend's own refusals come before it needs a process group."""

import numpy as np
import pytest
import torch

from fsdp_xla import FSDP, FSDPError, FSDPOptions, FSDPTypeError, MeshAxisError, transformer_auto_wrap_policy
from mesh import Mesh, Role
from mesh.roles import param_shard_axes, replicate_axes
from spmd import P
from spmd._backend import use_backend
from tests.fsdp_xla.helpers import GPT, SMALL, Block


def mesh(*axes, ids=None):
    names = tuple(a for a, _ in axes)
    shape = tuple(n for _, n in axes)
    return Mesh(np.arange(int(np.prod(shape))) if ids is None else ids, shape, names)


FC = mesh(("fsdp", 2), ("context", 2))
HSDP = mesh(("data", 2), ("fsdp", 2))


@pytest.mark.parametrize(
    "on, options, shard, replicate",
    [
        (mesh(("fsdp", 4)), {}, "fsdp", ()),  # as before: one fsdp axis, no replicas
        (mesh(("fsdp", 2), ("model", 2)), {}, "fsdp", ()),
        (FC, {}, ("fsdp", "context"), ()),  # the mesh's parameter-shard axes, flattened
        (mesh(("context", 2), ("fsdp", 2)), {}, ("context", "fsdp"), ()),  # in mesh order
        (mesh(("context", 4)), {}, "context", ()),
        (HSDP, {}, "fsdp", "data"),  # the replicate role: HSDP, as torchtitan does
        (mesh(("data", 2), ("fsdp", 2), ("context", 2)), {}, ("fsdp", "context"), "data"),
        (mesh(("fsdp", 4), ("context", 1)), {}, "fsdp", ()),  # size 1: splits nothing, left out
        (mesh(("data", 1), ("fsdp", 4)), {}, "fsdp", ()),  # one copy: nothing to reduce over
        (mesh(("fsdp", 1)), {}, "fsdp", ()),  # one device: still stored over its axis
        (mesh(("fsdp", 2), ("context", 1)), {"fsdp_axis": ("fsdp", "context")}, ("fsdp", "context"), ()),  # named
        (mesh(("data", 1), ("fsdp", 4)), {"replicate_axis": "data"}, "fsdp", "data"),  # named: kept
        (FC, {"fsdp_axis": ("context", "fsdp")}, ("fsdp", "context"), ()),  # any order given
        (FC, {"fsdp_axis": param_shard_axes(FC.axis_names)}, ("fsdp", "context"), ()),
        (FC, {"fsdp_axis": ["fsdp"]}, "fsdp", ()),
        (FC, {"fsdp_axis": ("fsdp",)}, "fsdp", ()),
        (FC, {"fsdp_axis": Role.FSDP}, "fsdp", ()),
        (HSDP, {"replicate_axis": ()}, "fsdp", ()),
        (HSDP, {"replicate_axis": replicate_axes(HSDP.axis_names)}, "fsdp", "data"),
        (HSDP, {"fsdp_axis": ("data", "fsdp")}, ("data", "fsdp"), ()),  # sharded over data: not replicated
    ],
)
def test_axes_resolve_to_spec_entries_in_mesh_order(on, options, shard, replicate):
    resolved = FSDPOptions(mesh=on, **options)
    assert (resolved.fsdp_axis, resolved.replicate_axis) == (shard, replicate)
    assert type(resolved.fsdp_axis) in (str, tuple) and not isinstance(resolved.fsdp_axis, Role)
    again = FSDPOptions(mesh=on, fsdp_axis=resolved.fsdp_axis, replicate_axis=resolved.replicate_axis)
    assert again == resolved  # resolving a resolved value changes nothing


def test_the_axis_sets_are_tuples_in_mesh_order():
    resolved = FSDPOptions(mesh=mesh(("data", 2), ("fsdp", 2), ("context", 2)))
    assert resolved.shard_axes == ("fsdp", "context") and resolved.replicate_axes == ("data",)
    assert resolved.data_parallel_axes == ("data", "fsdp", "context")


BAD = [
    (FC, {"fsdp_axis": ("fsdp", "model")}, MeshAxisError, r"no axis 'model'; mesh\{'fsdp': 2, 'context': 2\} has axes"),
    (FC, {"fsdp_axis": ("fsdp", "fsdp")}, MeshAxisError, r"names mesh axis 'fsdp' twice; .* fsdp_axis=\('fsdp',\)"),
    (FC, {"fsdp_axis": ()}, MeshAxisError, r"fsdp_axis=\(\) names no mesh axis.*leave fsdp_axis out"),
    (FC, {"fsdp_axis": 0}, FSDPTypeError, r"fsdp_axis must be a mesh axis name, a tuple of them, or None"),
    (FC, {"fsdp_axis": ("fsdp", None)}, FSDPTypeError, r"got \('fsdp', None\) \(tuple\)"),
    (HSDP, {"replicate_axis": "fsdp"}, MeshAxisError, r"replicate_axis='fsdp' names 'fsdp', which FSDP shards .* both"),
    (
        HSDP,
        {"fsdp_axis": ("data", "fsdp"), "replicate_axis": "data"},
        MeshAxisError,
        r"Drop it from one of them \(replicate_axis=\(\) keeps it a shard axis\)",
    ),
    (HSDP, {"replicate_axis": ("data", "data")}, MeshAxisError, r"replicate_axis=\('data', 'data'\) names .* twice"),
    (HSDP, {"replicate_axis": "replica"}, MeshAxisError, r"replicate_axis='replica': the mesh has no axis 'replica'"),
    (
        mesh(("data", 2), ("model", 2)),
        {},
        MeshAxisError,
        r"has axes \('data', 'model'\)\. Name one axis 'fsdp' .* or pass fsdp_axis=",
    ),
]


@pytest.mark.parametrize("on, options, error, said", BAD)
def test_bad_axes_are_refused_with_the_fix(on, options, error, said):
    with pytest.raises(error, match=said):
        FSDPOptions(mesh=on, **options)


@pytest.fixture
def on_dtensor():
    use_backend("dtensor")  # no process group: every refusal below comes before one is needed
    try:
        yield
    finally:
        use_backend(None)


def untouched(model):
    return type(model) is GPT and all(
        type(p) is torch.nn.Parameter and p.device.type == "cpu" for p in model.parameters()
    )


def only_fsdp(name, p):
    return P("fsdp")


DTENSOR_BAD = [
    *[(on, options, error, said) for on, options, error, said in BAD],
    (mesh(("fsdp", 2), ("data", 2)), {}, FSDPError, r"puts replicate axis\(es\) \('data',\) after shard axis"),
    (
        mesh(("fsdp", 2), ("context", 2), ids=np.array([[0, 2], [1, 3]])),
        {},
        FSDPError,
        r"flattens fsdp_axis axes \('fsdp', 'context'\) .* ids along them in mesh order are \[0, 2, 1, 3\]",
    ),
    (FC, {"param_spec_fn": only_fsdp}, FSDPError, r"must name exactly \('fsdp', 'context'\), on one dim"),
    (FC, {"param_spec_fn": lambda n, p: P(("context", "fsdp"))}, FSDPError, r"as one dim of one flattened mesh"),
    (HSDP, {"param_spec_fn": lambda n, p: P(("data", "fsdp"))}, FSDPError, r"'data' is a replicate axis"),
    (HSDP, {"shard_output": P("fsdp")}, FSDPError, r"split on dim 0 over \('data', 'fsdp'\) \(P\(\('data', 'fsdp'\)"),
]


@pytest.mark.parametrize("on, options, error, said", DTENSOR_BAD)
def test_a_refused_wrap_on_dtensor_leaves_the_model_as_it_was(on_dtensor, on, options, error, said):
    model = GPT(**SMALL)
    with pytest.raises(error, match=said):
        FSDP(model, mesh=on, auto_wrap_policy=transformer_auto_wrap_policy({Block}), **options)
    assert untouched(model)


def test_what_fully_shard_can_express_is_accepted(on_dtensor):
    """The checks before sharding pass (the device count is what stops here, with no process group)."""
    for on, options in [
        (FC, {"param_spec_fn": lambda n, p: P(None, ("fsdp", "context")) if p.dim() == 2 else P(("fsdp", "context"))}),
        (FC, {"shard_output": P(("fsdp", "context"))}),
        (HSDP, {"shard_output": P(("data", "fsdp"))}),
        (mesh(("fsdp", 4)), {"shard_output": P("fsdp")}),
    ]:
        with pytest.raises(Exception, match="init_process_group") as caught:
            FSDP(GPT(**SMALL), mesh=on, **options)
        assert not isinstance(caught.value, FSDPError), caught.value
