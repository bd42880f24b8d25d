"""FSDP wraps in place, keeps names, composes with tensor parallelism, and rejects bad input
with messages that say what to change."""

import copy

import numpy as np
import pytest
import torch

from fsdp_xla import (
    FSDP,
    FSDPError,
    FSDPTypeError,
    FullyShardedDataParallel,
    MeshAxisError,
    WrapPolicyError,
    deferred_init,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)
from mesh import Mesh, NoMeshError, set_global_mesh, use_mesh
from spmd import P, ShardableLayerNorm, UnknownAxisError, clear_sharding, get_sharding, mark_sharding
from spmd.sharding._named_sharding import hlo_sharding_for
from tests.fsdp_xla.helpers import GPT, SMALL, Block, batches, fsdp_mesh, lm_loss, train


def test_wraps_in_place_and_keeps_names_and_types(xla):
    model = GPT(**SMALL)
    names = list(model.state_dict())
    wrapped = FSDP(model, mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    assert wrapped is model
    assert isinstance(model, GPT) and isinstance(model, FullyShardedDataParallel)
    assert all(isinstance(b, FullyShardedDataParallel) and isinstance(b, Block) for b in model.h)
    assert not isinstance(model.wte, FullyShardedDataParallel)
    assert list(model.state_dict()) == names
    assert model.fsdp_units == ["", "h.0", "h.1", "h.2"]
    assert model.lm_head.weight is model.wte.weight  # the tie survives
    assert isinstance(model.ln_f, ShardableLayerNorm)


def test_parameters_are_stored_sharded_on_the_fsdp_axis(xla):
    mesh = fsdp_mesh()
    model = FSDP(GPT(**SMALL), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    specs = model.fsdp_param_specs()
    assert specs["h.0.c_fc.weight"] == P("fsdp", None)  # [256, 64]: the larger dim
    assert specs["wte.weight"] == P("fsdp", None)
    weight = model.h[0].c_fc.weight
    assert weight.device.type == "xla"
    assert get_sharding(weight) == hlo_sharding_for(mesh, P("fsdp", None), 2)


def test_device_parameters_keep_their_identity(xla):
    model = GPT(**SMALL).to(xla)
    model.lm_head.weight = model.wte.weight  # .to() unties; tie again, as torch_xla advises
    before = [id(p) for p in model.parameters()]
    FSDP(model, mesh=fsdp_mesh())
    assert [id(p) for p in model.parameters()] == before  # an optimizer built before still works


def test_global_mesh_is_used(xla):
    with use_mesh(fsdp_mesh()):
        model = FSDP(GPT(**SMALL))
    assert model.fsdp_mesh == fsdp_mesh()


def test_bad_input_is_rejected_with_the_fix(xla):
    set_global_mesh(None)
    with pytest.raises(NoMeshError, match="no global mesh is set"):
        FSDP(GPT(**SMALL))
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    with pytest.raises(MeshAxisError, match=r"has axes \('data', 'model'\)\. Name one axis 'fsdp'"):
        FSDP(GPT(**SMALL), mesh=mesh)
    with pytest.raises(WrapPolicyError, match="mutually exclusive"):
        FSDP(
            GPT(**SMALL),
            mesh=fsdp_mesh(),
            auto_wrap_policy=[transformer_auto_wrap_policy({Block}), size_based_auto_wrap_policy(10)],
        )
    with pytest.raises(WrapPolicyError, match=r"names layer class\(es\) \['Conv1d'\]"):
        FSDP(GPT(**SMALL), mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({torch.nn.Conv1d}))
    with pytest.raises(TypeError, match=r"shard_output must be a PartitionSpec.*Write P\('fsdp'\)"):
        FSDP(GPT(**SMALL), mesh=fsdp_mesh(), shard_output=("fsdp",))
    with pytest.raises(TypeError, match="FSDP wraps an nn.Module, got str"):
        FSDP("model", mesh=fsdp_mesh())
    with pytest.raises(WrapPolicyError, match=r"got layer classes \(Block\), not a policy.*\(\{Block\}\)"):
        FSDP(GPT(**SMALL), mesh=fsdp_mesh(), auto_wrap_policy={Block})
    with pytest.raises(WrapPolicyError, match="takes layer classes, got the string 'Block'"):
        transformer_auto_wrap_policy("Block")
    with pytest.raises(TypeError, match="reshard_after_forward must be True or False, got 'false'"):
        FSDP(GPT(**SMALL), mesh=fsdp_mesh(), reshard_after_forward="false")
    with pytest.raises(TypeError, match=r"MixedPrecisionPolicy is another library's class"):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        FSDP(GPT(**SMALL), mesh=fsdp_mesh(), mixed_precision=MixedPrecisionPolicy())
    with pytest.raises(ValueError, match=r"the mesh has 4 devices but the runtime has 8"):
        FSDP(GPT(**SMALL), mesh=Mesh(np.arange(4), (4,), ("fsdp",)))
    with pytest.raises(TypeError, match=r"GPT \(FSDP on XLA\) got argument 0 of shape \(2, 8\) on the CPU"):
        FSDP(GPT(**SMALL), mesh=fsdp_mesh())(torch.zeros(2, 8, dtype=torch.long))
    model = FSDP(GPT(**SMALL), mesh=fsdp_mesh())
    with pytest.raises(FSDPError, match="already wrapped by FSDP; wrap a model once"):
        FSDP(model, mesh=fsdp_mesh())
    outer = torch.nn.Sequential(model)
    with pytest.raises(FSDPError, match="Submodule '0' is already wrapped"):
        FSDP(outer, mesh=fsdp_mesh())
    with pytest.raises(
        TypeError, match=r"param_spec_fn returned None for parameter 'wte.weight' of shape \(64, 64\), which is not"
    ):
        FSDP(GPT(**SMALL), mesh=fsdp_mesh(), param_spec_fn=lambda name, p: None)
    with pytest.raises(ValueError, match=r"FSDP, parameter 'wte.weight': .*shape \(64, 64\).*'model'"):
        FSDP(GPT(**SMALL), mesh=fsdp_mesh(), param_spec_fn=lambda name, p: P("model"))


def test_a_parameter_sharded_another_way_needs_a_spec_fn(xla):
    mesh = Mesh(np.arange(8), (4, 2), ("fsdp", "model"))
    model = GPT(**SMALL).to(xla)
    model.lm_head.weight = model.wte.weight
    mark_sharding(model.h[0].c_fc.weight, mesh, P("model", None))
    with pytest.raises(FSDPError, match=r"'h.0.c_fc.weight' of shape \(256, 64\) is already sharded"):
        FSDP(model, mesh=mesh)


def tensor_parallel_spec(name, param):
    """Megatron-style 2-D: column-parallel c_attn/c_fc, row-parallel projections, fsdp on the other dim."""
    if name.endswith(("c_attn.weight", "c_fc.weight")):
        return P("model", "fsdp")
    if name.endswith("c_proj.weight"):
        return P("fsdp", "model")
    return P("fsdp") if param.dim() == 1 and param.shape[0] % 4 == 0 else P(*([None] * param.dim()))


def test_fsdp_composes_with_tensor_parallel_specs(xla):
    mesh = Mesh(np.arange(8), (4, 2), ("fsdp", "model"))
    torch.manual_seed(0)
    ref = GPT(**SMALL)
    model = FSDP(
        copy.deepcopy(ref),
        mesh=mesh,
        auto_wrap_policy=transformer_auto_wrap_policy({Block}),
        param_spec_fn=tensor_parallel_spec,
    )
    assert model.fsdp_param_specs()["h.1.c_fc.weight"] == P("model", "fsdp")
    assert get_sharding(model.h[1].c_fc.weight) == hlo_sharding_for(mesh, P("model", "fsdp"), 2)
    data = batches(2)
    torch.testing.assert_close(
        torch.tensor(train(model, data, xla, mesh)), torch.tensor(train(ref, data)), rtol=1e-5, atol=0
    )


def test_output_sharding(xla):
    import torch_xla

    mesh = fsdp_mesh()
    model = FSDP(GPT(**SMALL), mesh=mesh, shard_output=P("fsdp"))
    tokens = batches(1)[0].to(xla)
    mark_sharding(tokens, mesh, P("fsdp", None))
    logits = model(tokens[:, :-1])
    torch_xla.sync()
    assert get_sharding(logits) == hlo_sharding_for(mesh, P("fsdp"), 3)
    calls = []
    model2 = FSDP(GPT(**SMALL), mesh=mesh, shard_output=lambda out, m: calls.append(m) or out)
    model2(tokens[:, :-1])
    assert calls == [mesh]
    assert lm_loss(logits, tokens).item() > 0


@pytest.mark.parametrize(
    ("option", "value", "error", "message"),
    [
        ("sync_after_backward", "no", FSDPTypeError, r"sync_after_backward must be True, False or None, got 'no'"),
        ("init_seed", "x", FSDPTypeError, r"init_seed must be an int \(the seed of deferred init\), got 'x'"),
        ("init_seed", True, FSDPTypeError, r"init_seed must be an int"),
        ("param_spec_fn", 5, FSDPTypeError, r"param_spec_fn must be a function or None, got 5 \(int\)"),
        ("param_init_fn", 5, FSDPTypeError, r"param_init_fn must be a function or None, got 5 \(int\)"),
        ("shard_output", P("zz"), UnknownAxisError, r"shard_output=P\('zz'\).*'zz' is not in the mesh"),
    ],
)
@pytest.mark.parametrize("deferred", [False, True])
def test_options_of_the_wrong_type_are_refused_when_wrapping(xla, option, value, error, message, deferred):
    model = deferred_init(GPT, **SMALL) if deferred else GPT(**SMALL)
    with pytest.raises(error, match=message):
        FSDP(model, mesh=fsdp_mesh(), **{option: value})
    assert not isinstance(model, FullyShardedDataParallel)


def test_a_numpy_seed_is_an_int(xla):
    a = FSDP(deferred_init(GPT, **SMALL), mesh=fsdp_mesh(), init_seed=np.int64(3))
    b = FSDP(deferred_init(GPT, **SMALL), mesh=fsdp_mesh(), init_seed=3)
    torch.testing.assert_close(a.wte.weight.cpu(), b.wte.weight.cpu(), rtol=0, atol=0)


def _state(model):
    """Each module's class, each parameter's identity, device and sharding."""
    classes = {name: type(m) for name, m in model.named_modules()}
    params = {name: (id(p), p.device.type, str(get_sharding(p))) for name, p in model.named_parameters()}
    return classes, params


def _last_unit_bad_axis(model, mesh, xla):
    return dict(param_spec_fn=lambda name, p: P("zz") if name.startswith("h.2.") else P("fsdp"))


def _last_unit_marked(model, mesh, xla):
    model.to(xla)
    model.lm_head.weight = model.wte.weight
    mark_sharding(model.h[2].c_fc.weight, mesh, P("model", None))
    return {}


@pytest.mark.parametrize(
    ("refusal", "error"), [(_last_unit_bad_axis, UnknownAxisError), (_last_unit_marked, FSDPError)]
)
def test_a_refused_wrap_changes_nothing_and_a_retry_works(xla, refusal, error):
    mesh = Mesh(np.arange(8), (4, 2), ("fsdp", "model"))
    model = GPT(**SMALL)
    bad = refusal(model, mesh, xla)
    before = _state(model)
    with pytest.raises(error, match="h.2."):
        FSDP(model, mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}), **bad)
    assert _state(model) == before  # no class swapped (LayerNorms, units), no parameter moved or resharded
    if refusal is _last_unit_marked:  # the user's fix: drop the mark
        clear_sharding(model.h[2].c_fc.weight)
    FSDP(model, mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    assert model.fsdp_units == ["", "h.0", "h.1", "h.2"]


def test_options_check_themselves_when_built():
    """FSDPOptions is checked and resolved in its constructor, whoever builds it."""
    from fsdp_xla import FSDPOptions, FSDPTypeError, MeshAxisError
    from mesh import Mesh

    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    options = FSDPOptions(mesh=mesh, mixed_precision=torch.bfloat16, init_seed=np.int64(3))
    assert options.mixed_precision.compute_dtype == torch.bfloat16 and type(options.init_seed) is int
    with pytest.raises(FSDPTypeError, match="FSDP: gradient_checkpointing must be True or False, got 'no'"):
        FSDPOptions(mesh=mesh, gradient_checkpointing="no")
    with pytest.raises(MeshAxisError, match="has axes \\('data',\\)"):
        FSDPOptions(mesh=Mesh(np.arange(8), (8,), ("data",)))


def test_fsdp_is_fully_shard_by_its_own_constructor():
    from fsdp_xla import FullyShardedDataParallel

    assert "__new__" in vars(FullyShardedDataParallel)  # defined in the class, not patched on from api.py
    assert FullyShardedDataParallel.__new__.__qualname__ == "FullyShardedDataParallel.__new__"
