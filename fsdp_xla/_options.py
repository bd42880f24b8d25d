"""`FSDPOptions`: the options of one `fully_shard` call as one value each backend's FSDP
(`fsdp_xla._backends`) takes. It checks and resolves itself when built (``__post_init__``), so
each gets options that are already right, and `fully_shard` only builds one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fsdp_xla._axes import AxisNames, axis_entry, resolve_replicate_axes, resolve_shard_axes, total_size
from fsdp_xla._replicas import ReplicaSync
from fsdp_xla._sharding import SpecFn
from fsdp_xla.errors import FSDPTypeError, MeshAxisError, WrapPolicyError
from fsdp_xla.policies import MixedPrecision, WrapPolicy
from mesh import Mesh, mesh_or_global
from mesh.checks import require_bool, require_int, require_optional_bool
from mesh.roles import replicate_axes as replicate_role_axes
from spmd import PartitionSpec
from spmd.errors import ShardingError
from spmd.sharding import resolve_spec

__all__ = ["FSDPOptions"]


@dataclass(frozen=True)
class FSDPOptions:
    """The options of `fully_shard` (and `FSDP`), checked and resolved when built: a `Mesh`
    with the FSDP axes, the shard and replicate axes in mesh order (`fsdp_xla._axes`), one
    `WrapPolicy` or none, a `MixedPrecision` or none.

    Raises:
        MeshAxisError: no mesh; an axis of ``fsdp_axis`` or ``replicate_axis`` the mesh lacks,
            named twice, or in both; no ``fsdp_axis`` given and the mesh has no ``fsdp`` or
            ``context`` axis.
        WrapPolicyError: a policy that is not a single `WrapPolicy`.
        FSDPTypeError: a flag that is not a bool, a hook that is not callable, a seed that is
            not an int, an axis option that names no axes, a ``mixed_precision`` or
            ``shard_output`` of another type.
        ShardingError: a ``shard_output`` spec that does not fit the mesh.

    Attributes:
        mesh: the device mesh; default the global mesh.
        fsdp_axis: the mesh axis parameters are sharded on, or a tuple of axes sharded over as
            one (flattened in mesh order, torchtitan's ``dp_shard x cp``). Default: the mesh's
            parameter-shard axes (`mesh.roles.param_shard_axes`: ``fsdp``, then ``context``)
            but those of size 1, unless every one is.
            Resolved to a spec entry in mesh order: the name for one axis, the tuple for several.
        replicate_axis: the mesh axis (or axes) holding whole replicas of the shards (HSDP):
            gradients are all-reduced over it after the reduce-scatter over the shard axes.
            Default: the mesh's replicate-role axes (`mesh.roles.replicate_axes`: ``data``) of
            size above 1 that ``fsdp_axis`` does not shard over; ``()`` for none. Resolved like
            ``fsdp_axis``, ``()`` when there is none. A `fsdp_xla.ft.ReplicaGroup` (a
            `ReplicaSync`) instead: the replicas are other jobs, kept in step by torchft across
            the replica groups alive at each step (healing HSDP, dtensor backend only); it is
            kept in ``replicate_sync`` and ``replicate_axis`` resolves to ``()``.
        auto_wrap_policy: which submodules become units of their own: one
            `TransformerWrapPolicy` or `SizeWrapPolicy` (``None``: the root only, ZeRO-2-like).
        mixed_precision: a `MixedPrecision` (or a dtype, for ``MixedPrecision(dtype)``).
        reshard_after_forward: drop gathered parameters after each unit's forward and
            regather for backward (ZeRO-3). ``False`` keeps them until backward.
        gradient_checkpointing: recompute each non-root unit's activations in backward (on
            the dtensor backend with torch's composable ``checkpoint``).
        optimization_barriers: the barriers that keep XLA from merging the backward regather
            with the forward gather (and from hoisting gathers); turn off only to see why
            they are needed.
        shard_output: layout of the root's outputs (`OutputSharding`). On the dtensor
            backend only ``P(fsdp_axis)``, the layout each rank's part of the batch has.
        param_spec_fn: ``(name, parameter) -> PartitionSpec`` for the stored layout; default:
            the FSDP axis on the largest dim it divides (on the dtensor backend: dim 0, and a
            spec may name only ``fsdp_axis``, on one dim).
        param_init_fn: for deferred init, called on each module of a unit after its
            parameters are allocated on the host; default: the module's
            ``reset_parameters()`` and, for Hugging Face models, ``_init_weights``.
        init_seed: seed of deferred init; each module is seeded from it and its path, so
            the weights are the same for any mesh shape and wrap policy.
        sync_after_backward: run forward+backward as one graph and the optimizer step as
            another (a sync when backward ends). Default (``None``): on the CPU backend only.
            XLA's CPU compiler reduces gradients with an all-reduce and slices each shard out
            inside the optimizer's fused kernels, which run last; in one graph every unit's
            full gradient then stays alive until the optimizer. A TPU compile turns the
            reduction into a reduce-scatter, so the shard is all that stays.
        shardable_layer_norm: make each ``nn.LayerNorm`` a `spmd.ShardableLayerNorm`, which
            GSPMD keeps batch-sharded (torch_xla's own lowering all-gathers the activation
            over the whole mesh; see `spmd.layer_norm`).
    """

    mesh: Mesh | None = None
    fsdp_axis: AxisNames | None = None
    replicate_axis: AxisNames | ReplicaSync | None = None
    auto_wrap_policy: WrapPolicy | None = None
    mixed_precision: MixedPrecision | torch.dtype | None = None
    reshard_after_forward: bool = True
    gradient_checkpointing: bool = False
    optimization_barriers: bool = True
    shard_output: Any = None
    param_spec_fn: SpecFn | None = None
    param_init_fn: Callable[[torch.nn.Module], None] | None = None
    init_seed: int = 0
    sync_after_backward: bool | None = None
    shardable_layer_norm: bool = True
    replicate_sync: ReplicaSync | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for flag in (
            "reshard_after_forward",
            "gradient_checkpointing",
            "optimization_barriers",
            "shardable_layer_norm",
        ):
            require_bool(getattr(self, flag), f"FSDP: {flag}", FSDPTypeError)
        require_optional_bool(self.sync_after_backward, "FSDP: sync_after_backward", FSDPTypeError)
        for hook in ("param_spec_fn", "param_init_fn"):
            _check_hook(hook, getattr(self, hook))
        mesh = mesh_or_global(self.mesh, "FSDP")
        shard = resolve_shard_axes(mesh, self.fsdp_axis)
        sync = self.replicate_axis if isinstance(self.replicate_axis, ReplicaSync) else None
        if sync is not None:
            _check_no_replicas_in_mesh(mesh, shard, sync)
        replicate = () if sync is not None else resolve_replicate_axes(mesh, self.replicate_axis, shard)
        object.__setattr__(self, "replicate_sync", sync)
        _check_shard_output(self.shard_output, mesh)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "fsdp_axis", axis_entry(shard))
        object.__setattr__(self, "replicate_axis", axis_entry(replicate))
        object.__setattr__(self, "auto_wrap_policy", _resolve_policy(self.auto_wrap_policy))
        object.__setattr__(self, "mixed_precision", _resolve_precision(self.mixed_precision))
        seed = require_int(
            self.init_seed, "FSDP: init_seed", FSDPTypeError, allowed="an int (the seed of deferred init)"
        )
        object.__setattr__(self, "init_seed", seed)  # a Python int: a numpy int's arithmetic would overflow

    @property
    def shard_axes(self) -> tuple[str, ...]:
        """The axes parameters are sharded over, in mesh order."""
        return _axes_of(self.fsdp_axis)

    @property
    def replicate_axes(self) -> tuple[str, ...]:
        """The axes parameters are replicated over (HSDP), in mesh order; ``()`` for none."""
        return _axes_of(self.replicate_axis)

    @property
    def data_parallel_axes(self) -> tuple[str, ...]:
        """The replicate and shard axes, in mesh order: every rank along them trains on its own
        part of the batch, and gradients are averaged over all of them."""
        names = tuple(self.mesh.axis_names or ())
        return tuple(sorted((*self.replicate_axes, *self.shard_axes), key=names.index))


def _check_no_replicas_in_mesh(mesh: Mesh, shard: tuple[str, ...], sync: ReplicaSync) -> None:
    """With the replicas outside the mesh, a replicate axis of size > 1 inside it would hold
    copies that nothing keeps in step (FSDP2 takes one replicate dim: the hook's)."""
    inside = [a for a in replicate_role_axes(mesh.axis_names) if a not in shard and total_size(mesh, (a,)) > 1]
    if inside:
        raise MeshAxisError(
            f"FSDP replicate_axis={sync.describe()} keeps the replicas in step across replica groups, but "
            f"{mesh.describe()} has replicate axis {inside[0]!r} of size {total_size(mesh, (inside[0],))} inside the "
            "group too, whose copies nothing would average. Give each replica group a mesh of its own ranks over "
            f"the shard axes only (ParallelDims(fsdp=n).mesh()), or shard over it: fsdp_axis=({inside[0]!r}, ...)."
        )


def _axes_of(entry: Any) -> tuple[str, ...]:
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _resolve_precision(mixed_precision: MixedPrecision | torch.dtype | None) -> MixedPrecision | None:
    if mixed_precision is None or isinstance(mixed_precision, MixedPrecision):
        return mixed_precision
    if isinstance(mixed_precision, torch.dtype):
        return MixedPrecision(compute_dtype=mixed_precision)
    origin = type(mixed_precision).__module__
    hint = (
        f" ({origin}.{type(mixed_precision).__name__} is another library's class: use fsdp_xla.MixedPrecision)"
        if type(mixed_precision).__name__.endswith(("MixedPrecision", "MixedPrecisionPolicy"))
        else ""
    )
    raise FSDPTypeError(
        f"mixed_precision must be a fsdp_xla.MixedPrecision, a torch.dtype or None, got "
        f"{type(mixed_precision).__name__}{hint}."
    )


def _resolve_policy(policy: object) -> WrapPolicy | None:
    if policy is None or isinstance(policy, WrapPolicy):
        return policy
    if isinstance(policy, (list, tuple, set, frozenset)) and policy and all(isinstance(c, type) for c in policy):
        names = ", ".join(sorted(c.__name__ for c in policy))
        raise WrapPolicyError(
            f"auto_wrap_policy got layer classes ({names}), not a policy. Wrap them: "
            f"auto_wrap_policy=transformer_auto_wrap_policy({{{names}}})."
        )
    if isinstance(policy, (list, tuple, set, frozenset)):
        raise WrapPolicyError(
            f"auto_wrap_policy takes one policy, got {len(policy)}: transformer_auto_wrap_policy and "
            "size_based_auto_wrap_policy are mutually exclusive. Keep one (transformer layers for "
            "transformer models: a block's weights are then gathered together)."
        )
    raise WrapPolicyError(
        f"auto_wrap_policy must be a WrapPolicy (transformer_auto_wrap_policy({{Block}}) or "
        f"size_based_auto_wrap_policy(n)), got {policy!r}."
    )


def _check_shard_output(shard_output: object, mesh: Mesh) -> None:
    if shard_output is not None and not isinstance(shard_output, PartitionSpec) and not callable(shard_output):
        raise FSDPTypeError(
            f"shard_output must be a PartitionSpec, a function (output, mesh) -> output, or None; got "
            f"{shard_output!r:.100}. Write P('fsdp') for a tuple spec."
        )
    if isinstance(shard_output, PartitionSpec):  # its axes now, not at the first forward
        try:
            resolve_spec(mesh, shard_output, len(shard_output))
        except ShardingError as e:
            raise type(e)(f"FSDP shard_output={shard_output!r}: {e}") from None


def _check_hook(option: str, value: object) -> None:
    if value is not None and not callable(value):
        raise FSDPTypeError(f"FSDP: {option} must be a function or None, got {value!r:.60} ({type(value).__name__}).")
