"""The torch_xla backend: every call of a private ``torch_xla._XLAC`` binding lives here, and
every torch_xla call of the ``mesh`` package.

`TorchXlaBackend` implements the `ShardingBackend` protocol (GSPMD annotations on lazy
tensors). The module's functions are the torch_xla-only operations the rest of the product
needs beyond it (the inspector's dumps and scopes, FSDP's barriers and named graphs, shards,
manual sharding, the runtime's device attributes for `mesh.HybridMesh`, torch_xla's global
mesh for `mesh.set_global_mesh`); everything else speaks `HloSharding` values, which this
module turns into torch_xla ``OpSharding`` objects and back.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from typing import Any

import numpy as np
import torch

from spmd.hlo_sharding import HloSharding, ShardingKind

__all__ = [
    "TorchXlaBackend",
    "require_torch_xla",
    "torch_xla_module",
    "ensure_spmd",
    "device_count",
    "is_xla_tensor",
    "attach_sharding",
    "attach_sharding_constraint",
    "clear_sharding",
    "reshard_in_graph",
    "sharding_of",
    "local_shards",
    "local_shard_devices",
    "device_id",
    "optimization_barrier_",
    "tensors_hlo_text",
    "sync",
    "sync_tensors",
    "compile_count",
    "push_scope",
    "platform",
    "step_functions",
    "to_device_sharded",
    "checkpoint",
    "sync_named",
    "device_kind",
    "device_attributes",
    "mirror_global_mesh",
    "global_mesh",
    "op_sharding",
    "sharding_type",
    "xla_sharding_spec",
    "load_local_shards",
    "mark_manual_sharding",
    "full_to_shard_shape",
    "shard_to_full_shape",
    "from_cpu_shards",
    "shard_alike",
]

# torch_xla's ShardingType enum values (they are OpSharding.Type's).
_REPLICATED, _MAXIMAL, _TILED, _MANUAL, _PARTIAL = 0, 1, 3, 4, 5

# torch_xla 2.9 reads a tile assignment from nested Python lists of at most 5 levels
# (xla_sharding_util.cpp); a deeper one only logs an error and fails later with an unrelated
# RuntimeError (found by the fuzz campaign), so it is refused first.
MAX_TILED_RANK = 5


def require_torch_xla(feature: str) -> None:
    """Check that torch_xla is installed, without importing it (its device settings must come
    first).

    Raises:
        TorchXlaNotInstalledError: it is not (the current lane); the message names ``feature``,
            the install line and the dtensor backend.
    """
    if importlib.util.find_spec("torch_xla") is None:
        from spmd.errors import INSTALL_TORCH_XLA, TorchXlaNotInstalledError

        raise TorchXlaNotInstalledError(
            f"{feature} needs torch_xla, which is not installed here (torch {torch.__version__}). Install the "
            f"torch_xla lane: {INSTALL_TORCH_XLA}; or, on this torch, shard with the dtensor backend under "
            "torchrun (one process per device; docs/backends.md)."
        )


def torch_xla_module(name: str = "torch_xla", feature: str = "GSPMD on XLA tensors") -> Any:
    """torch_xla's module ``name``, imported now; the one gate every torch_xla import passes.

    Raises:
        TorchXlaNotInstalledError: torch_xla is not installed (see `require_torch_xla`).
    """
    require_torch_xla(feature)
    return importlib.import_module(name)


def _xlac() -> Any:
    return torch_xla_module("torch_xla", "GSPMD on XLA tensors")._XLAC


def ensure_spmd() -> None:
    """Turn on torch_xla's SPMD mode if it is off (``xr.use_spmd()``).

    Raises:
        SpmdModeError: a tensor was already placed on the XLA device in non-SPMD mode.
            torch_xla 2.9 then "forces" SPMD and the process segfaults at the next
            computation (measured on the CPU backend), so we refuse instead.
    """
    xr = torch_xla_module("torch_xla.runtime", "torch_xla's SPMD mode (spmd.enable_spmd, mark_sharding on XLA tensors)")

    if xr.is_spmd():
        return
    if _xlac()._xla_get_spmd_config_is_locked():
        from spmd.errors import SpmdModeError

        raise SpmdModeError(
            "SPMD mode is off and tensors already live on the XLA device, so it can no longer be "
            "turned on safely (torch_xla 2.9 crashes later if it is). Call spmd.enable_spmd() (or "
            "torch_xla.runtime.use_spmd()) at the top of the script, before any .to(torch_xla.device())."
        )
    xr.use_spmd()
    if platform() == "CPU" and device_count() == 1:
        import warnings

        warnings.warn(
            "SPMD is on with a CPU runtime of 1 device, so nothing is sharded. For virtual devices call "
            "spmd.configure_default_devices() (or set CPU_NUM_DEVICES=8) before torch_xla is imported.",
            stacklevel=3,
        )


@functools.cache
def device_count() -> int:
    """The number of devices of the runtime (all hosts)."""
    return len(_xlac()._xla_get_all_runtime_devices())


def is_xla_tensor(t: torch.Tensor) -> bool:
    """Whether ``t`` lives on an XLA device."""
    return isinstance(t, torch.Tensor) and t.device.type == "xla"


def sharding_args(hlo: HloSharding) -> tuple[list, list, list, int]:
    """``(tile assignment, group assignment, replication groups, type)``: the arguments torch_xla's
    ``OpSharding`` and ``XlaShardingSpec`` both take after the tensor (and what its
    ``Mesh._get_op_sharding_args`` returns)."""
    if hlo.kind is ShardingKind.REPLICATED:
        return [], [], [], _REPLICATED
    if hlo.kind is ShardingKind.MAXIMAL:
        return [list(hlo.devices)], [], [], _MAXIMAL
    if hlo.kind is ShardingKind.MANUAL:
        return [], [], [], _MANUAL
    if len(hlo.tile_shape) > MAX_TILED_RANK:
        from spmd.errors import ShardingError

        raise ShardingError(
            f"torch_xla 2.9 can only split tensors of at most {MAX_TILED_RANK} dims, but {hlo} splits one of "
            f"{len(hlo.tile_shape)} dims. Reshape it to {MAX_TILED_RANK} dims or fewer (merge the dims that are "
            "not split) before sharding it, or replicate it with P()."
        )
    if hlo.replication == 1:
        return hlo.tile_assignment().reshape(hlo.tile_shape).tolist(), [], [], _TILED
    assignment = hlo.tile_assignment()
    groups = assignment.reshape(-1, hlo.replication).tolist()
    group_ids = np.arange(len(groups)).reshape(hlo.tile_shape).tolist()
    return assignment.tolist(), group_ids, groups, _PARTIAL


def op_sharding(hlo: HloSharding, cache: dict | None = None) -> Any:
    """torch_xla's ``OpSharding`` for ``hlo``.

    With ``cache`` (a mesh's `Mesh.memo`), each distinct sharding is built once per mesh, as
    torch_xla's ``Mesh.get_op_sharding`` caches it (each build counts in torch_xla's
    ``CreateOpSharding`` metric, and is costly on a large mesh).
    """
    if cache is None:
        return _xlac().OpSharding(*sharding_args(hlo))
    key = ("op_sharding", hlo)
    if key not in cache:
        cache[key] = _xlac().OpSharding(*sharding_args(hlo))
    return cache[key]


def xla_sharding_spec(t: torch.Tensor, hlo: HloSharding, minibatch: bool = False) -> Any:
    """torch_xla's ``XlaShardingSpec`` of ``hlo`` for ``t``: what its data loaders and
    ``send_cpu_data_to_device(input_sharding=...)`` take. With ``minibatch`` the batch dim of
    ``t`` is this host's part of the global batch."""
    return _xlac().XlaShardingSpec(t, *sharding_args(hlo), bool(minibatch))


def to_device_sharded(cpu_tensor: torch.Tensor, hlo: HloSharding) -> torch.Tensor:
    """Copy a host tensor to the XLA device laid out as ``hlo``: each device receives only its
    shard (no replicated copy is made first, unlike ``t.to(device)`` + ``mark_sharding``)."""
    torch_xla = torch_xla_module()

    device = str(torch_xla.device())
    return _xlac()._xla_tensors_from_aten([cpu_tensor], [device], [xla_sharding_spec(cpu_tensor, hlo)])[0]


def checkpoint(function: Any, *args: torch.Tensor) -> Any:
    """torch_xla's activation checkpointing: ``function(*args)`` runs without saving
    activations; backward puts an optimization barrier over the inputs and incoming gradients,
    then recomputes (so XLA cannot merge the recompute with the forward)."""
    xla_checkpoint = torch_xla_module("torch_xla.utils.checkpoint", "gradient checkpointing on GSPMD").checkpoint

    return xla_checkpoint(function, *args, use_reentrant=True)


def attach_sharding(t: torch.Tensor, hlo: HloSharding, cache: dict | None = None) -> None:
    """Attach ``hlo`` to ``t`` in place: device data is resharded; a traced value gets a
    sharding custom-call (a constraint). Raises torch_xla's RuntimeError if ``t`` already has
    an annotation; callers clear it first."""
    op = op_sharding(hlo, cache)
    try:
        _xlac()._xla_mark_sharding(t, op)
    except RuntimeError as e:
        # A step's output right after torch_xla.sync(): its device data is still being computed
        # (execution is asynchronous) and torch_xla refuses to reshard it. Wait, then reshard.
        if "Data does not present on any device" not in str(e):
            raise
        _xlac()._xla_wait_device_ops(devices=[])
        _xlac()._xla_mark_sharding(t, op)


def attach_sharding_constraint(t: torch.Tensor, hlo: HloSharding, cache: dict | None = None) -> None:
    """Put a sharding custom-call on ``t``'s traced value without touching its data."""
    _xlac()._xla_annotate_custom_sharding(t, op_sharding(hlo, cache))


def reshard_in_graph(t: torch.Tensor) -> None:
    """Make sharded device data ``t`` a traced value (``t *= 1``), so that a new sharding
    attached to it is laid out by the next graph instead of at once.

    Resharding device data at once is torch_xla's ``ReshardData``, which builds and compiles a
    new identity program on every call (no cache: pjrt_computation_client.cpp): alternating
    ``mark_sharding(w, ..., replace=True)`` between two specs measured 20 compiles in 20 steps,
    in plain torch_xla too. Traced, the reshard is part of the step's graph, which torch_xla
    caches by its input and output shardings: 2 variants, compiled once each. Left alone: an
    intermediate of an autograd graph (the in-place op would invalidate what backward saved).
    """
    if t.requires_grad and not t.is_leaf:
        return
    if "\nIR: None\n" not in str(_xlac()._get_xla_tensor_debug_info(t)):
        return  # already traced: the sharding goes on its IR as it is
    with torch.no_grad():
        t.mul_(True)  # ``True`` is 1 in t's dtype, bool included; XLA folds the multiply away


def clear_sharding(t: torch.Tensor) -> None:
    """Remove ``t``'s sharding annotation."""
    _xlac()._xla_clear_sharding(t)


def sharding_type(t: torch.Tensor) -> int | None:
    """torch_xla's ``ShardingType`` value of ``t``'s sharding, or ``None`` when it has none."""
    value = _xlac()._get_xla_sharding_type(t)
    return None if value is None else int(value)


def sharding_of(t: torch.Tensor) -> HloSharding | None:
    """The sharding torch_xla holds for ``t``, or ``None`` when it has none."""
    text = _xlac()._get_xla_sharding_spec(t)
    return HloSharding.parse(text) if text else None


def sharding_text(t: torch.Tensor) -> str:
    """torch_xla's own text for ``t``'s sharding ('' when it has none)."""
    return str(_xlac()._get_xla_sharding_spec(t))


def local_shards(t: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """``(device id, padded CPU copy of the shard)`` for each addressable device."""
    return [(device_id(dev), data) for data, dev in local_shard_devices(t)]


def device_id(name: str) -> int:
    """The device id in a torch_xla device string (``"CPU:3"``, ``"xla:3"`` -> 3)."""
    return int(name.rsplit(":", 1)[-1])


def local_shard_devices(t: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    """``(padded CPU copy of the shard, torch_xla device string)`` for each addressable device."""
    return [(data, str(dev)) for data, dev in _xlac()._get_local_shards([t])[0]]


def optimization_barrier_(tensors: list[torch.Tensor]) -> None:
    """XLA's optimization barrier over ``tensors``, in place."""
    _xlac()._xla_optimization_barrier_(tensors)


def tensors_hlo_text(tensors: list[torch.Tensor]) -> str:
    """The unpartitioned HLO module that would compute ``tensors``."""
    return str(_xlac()._get_xla_tensors_hlo(tensors))


def sync() -> None:
    """Cut the traced graph and run it (``torch_xla.sync()``)."""
    torch_xla = torch_xla_module()

    torch_xla.sync()


def sync_named(name: str) -> None:
    """Cut the traced graph and run it as a graph named ``name`` (its HLO module name), without
    running ``torch_xla.sync``'s step bookkeeping (so it does not count as a step)."""
    X = _xlac()
    saved = X._get_current_graph_name()
    X._set_current_graph_name(name)
    try:
        X._xla_step_marker(X._xla_get_default_device(), [], wait=False)
    finally:
        X._set_current_graph_name(saved)


def sync_tensors(tensors: list[torch.Tensor]) -> None:
    """Compute ``tensors`` now (and only what they need), waiting for the result."""
    _xlac()._xla_sync_multi(tensors, devices=[], wait=True)


def compile_count() -> int:
    """How many graphs torch_xla has compiled in this process (its ``CompileTime`` metric)."""
    met = torch_xla_module("torch_xla.debug.metrics")

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def push_scope(name: str) -> Any:
    """Open a named scope for the IR traced from now on; XLA_HLO_DEBUG=1 writes it into each
    op's ``op_name`` metadata (as ``name.N/...``). The scope closes when the returned handle
    is released, so handles must be released in reverse order."""
    return _xlac().profiler.scope_pusher(name)


def platform() -> str:
    """The PJRT device type: ``CPU``, ``TPU``, ..."""
    xr = torch_xla_module("torch_xla.runtime")

    return str(xr.device_type())


def step_functions() -> list[tuple[Any, str]]:
    """``(module, attribute)`` of the function that ends a step, ``torch_xla.sync``, for the
    inspector to wrap. ``xm.mark_step``, ``torch_xla.step()`` and ``MpDeviceLoader`` call it
    by that name, so wrapping it counts their steps too."""
    torch_xla = torch_xla_module()

    return [(torch_xla, "sync")]


def device_attributes() -> list[dict]:
    """Per-device attributes of the runtime (``coords``, ``core_on_chip``, ``slice_index`` on
    TPU), in device id order: what `mesh.HybridMesh` orders devices by."""
    xr = torch_xla_module("torch_xla.runtime")

    return list(xr.global_runtime_device_attributes())


def mirror_global_mesh(mesh: object | None) -> None:
    """Make torch_xla's global mesh this very mesh object (``None`` clears it).

    Our `Mesh` has every method torch_xla's code calls on a mesh (``get_op_sharding``,
    ``get_axis_name_idx``, ``mesh_shape``, ``axis_names``, ``shape()``, ``size()``...), and
    torch_xla checks no mesh's type, so torch_xla's FSDPv2 and the Hugging Face Trainer's XLA
    path use it as it is; ``id(their_mesh) == id(ours)``, as torch_xla's own tests expect.
    """
    if mesh is None:
        module = sys.modules.get("torch_xla.distributed.spmd.xla_sharding")
        if module is not None:
            module.set_global_mesh(None)
        return
    if importlib.util.find_spec("torch_xla") is None:  # the dtensor backend, without torch_xla installed
        return
    # Importing torch_xla does not start its runtime; it only makes the setter reachable.
    xla_sharding = torch_xla_module("torch_xla.distributed.spmd.xla_sharding")

    xla_sharding.set_global_mesh(mesh)


def global_mesh() -> object | None:
    """torch_xla's global mesh (ours, or a torch_xla ``Mesh`` set by torch_xla's own
    ``set_global_mesh``), or ``None``; torch_xla is not imported to find out."""
    module = sys.modules.get("torch_xla.distributed.spmd.xla_sharding")
    return None if module is None else module.get_global_mesh()


def device_kind() -> str:
    """The accelerator's kind as XLA names it ("TPU v5 lite", "TPU7x", "cpu")."""
    xm = torch_xla_module("torch_xla.core.xla_model")

    return str(xm.xla_device_kind())


def load_local_shards(t: torch.Tensor, shards: list[torch.Tensor], devices: list[str]) -> None:
    """Replace the device data of sharded ``t`` by ``shards`` (host tensors, padded as the
    devices hold them), one per entry of ``devices`` (torch_xla device strings)."""
    _xlac()._load_local_shards(t, shards, devices)


def mark_manual_sharding(t: torch.Tensor) -> None:
    """Mark traced ``t`` as manually sharded (``{manual}``): GSPMD leaves it alone."""
    _xlac()._mark_manual_sharding(t, op_sharding(HloSharding.manual()))


def full_to_shard_shape(t: torch.Tensor) -> torch.Tensor:
    """XLA's ``SPMDFullToShardShape`` of sharded ``t``: each device's block, manual from here."""
    return _xlac()._spmd_full_to_shard_shape(t)


def shard_to_full_shape(
    t: torch.Tensor, hlo: HloSharding, shape: tuple[int, ...], dtype: torch.dtype, cache: dict | None = None
) -> torch.Tensor:
    """XLA's ``SPMDShardToFullShape``: manual per-device blocks ``t`` back to a global tensor of
    ``shape`` laid out as ``hlo``."""
    return _xlac()._spmd_shard_to_full_shape(t, op_sharding(hlo, cache), torch.Size(shape), dtype)


def from_cpu_shards(shards: list[torch.Tensor], hlo: HloSharding, global_shape: tuple[int, ...] | None) -> torch.Tensor:
    """A global XLA tensor laid out as ``hlo`` whose device ``i`` holds ``shards[i]`` (host
    tensors, one per runtime device, padded blocks allowed; ``global_shape`` trims padding)."""
    size = None if global_shape is None else torch.Size(global_shape)
    return _xlac()._global_tensor_from_cpu_shards(shards, op_sharding(hlo), size)


def shard_alike(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """XLA's ``ShardAlike`` pair: ``x`` and ``y`` get one sharding, whichever GSPMD picks
    (through torch_xla's JAX bridge, as its ``shard_as``)."""
    xb = torch_xla_module("torch_xla.core.xla_builder", "shard_as")
    from jax.experimental.shard_alike import shard_alike as jax_shard_alike

    return xb.call_jax(jax_shard_alike, (x, y))


class TorchXlaBackend:
    """`ShardingBackend` on torch_xla's GSPMD: a sharding is an annotation on a lazy tensor."""

    name = "torch_xla"
    more_devices = (
        "call spmd.configure_default_devices(n) before torch_xla is imported (on CPU it sets CPU_NUM_DEVICES=n; "
        "without it torch_xla's CPU runtime has 1 device)"
    )

    def accepts(self, t: torch.Tensor) -> bool:
        return is_xla_tensor(t)

    def refusal(self, t: torch.Tensor, context: str) -> Exception:
        from spmd.errors import NotAnXlaTensorError

        return NotAnXlaTensorError(
            f"{context}: it is on device '{t.device}', not an XLA device. Move it first: "
            "t = t.to(torch_xla.device()) (modules: model.to(torch_xla.device())); or, in a torchrun job, "
            "shard it with the dtensor backend (torch.distributed.init_process_group() first)."
        )

    def device_count(self) -> int:
        return device_count()

    def shard(self, t: torch.Tensor, sharding: Any, hlo: HloSharding, *, replace: bool) -> torch.Tensor:
        from spmd.errors import ShardingConflictError
        from spmd.sharded_tensor import XLAShardedTensor

        ensure_spmd()
        existing = sharding_of(t)
        if existing is not None and existing != hlo:
            if existing.kind is ShardingKind.MANUAL:
                raise ShardingConflictError(
                    f"mark_sharding: the tensor of shape {tuple(t.shape)} is manually sharded ({{manual}}: inside an "
                    f"enable_manual_sharding region), so GSPMD cannot lay it out as {sharding.spec!r}. Call "
                    "disable_manual_sharding(t, spec, full_shape) first, then mark the result."
                )
            if existing.kind is not ShardingKind.REPLICATED and not replace:
                raise ShardingConflictError(
                    f"mark_sharding: the tensor of shape {tuple(t.shape)} is already sharded as {existing}; spec "
                    f"{sharding.spec!r} over {sharding.mesh.describe()} asks for {hlo}. Pass replace=True to reshard "
                    "it, or call clear_sharding(t) first."
                )
            reshard_in_graph(t)
            clear_sharding(t)
            existing = None
        if existing is None:
            attach_sharding(t, hlo, sharding.mesh.memo)
        return XLAShardedTensor._view(t, sharding)

    def constrain(self, t: torch.Tensor, sharding: Any, hlo: HloSharding) -> torch.Tensor:
        ensure_spmd()
        out = t.clone()
        attach_sharding_constraint(out, hlo, sharding.mesh.memo)
        return out

    def clear(self, t: torch.Tensor) -> torch.Tensor:
        if not is_xla_tensor(t):
            raise self.refusal(t, f"clear_sharding(tensor of shape {tuple(t.shape)})")
        clear_sharding(t)
        return t

    def barrier(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        optimization_barrier_(tensors)
        return tensors

    def sharding_of(self, t: torch.Tensor) -> HloSharding | None:
        return sharding_of(t) if is_xla_tensor(t) else None

    def process_index(self) -> int:
        from spmd._backend import torch_xla_processes

        return torch_xla_processes.process_index()

    def process_count(self) -> int:
        from spmd._backend import torch_xla_processes

        return torch_xla_processes.process_count()

    def device_processes(self) -> tuple[int, ...]:
        from spmd._backend import torch_xla_processes

        return torch_xla_processes.device_processes()

    def all_process_values(self, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        from spmd._backend import torch_xla_processes

        return torch_xla_processes.all_process_values(values)

    def from_local_blocks(
        self, blocks: dict[int, torch.Tensor], sharding: Any, hlo: HloSharding, global_shape: tuple[int, ...]
    ) -> torch.Tensor:
        from spmd._backend import torch_xla_processes

        return torch_xla_processes.from_local_blocks(blocks, hlo, global_shape)
