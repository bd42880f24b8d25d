"""torch_xla's runtime: the one gate every torch_xla import passes, SPMD mode, devices, steps and
named graphs, torch_xla's global mesh, and the XLA ops the product needs beyond shardings
(barriers, checkpointing, HLO text, ``shard_as``)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from typing import Any

import torch

__all__ = [
    "MORE_DEVICES",
    "is_pending",
    "checkpoint",
    "compile_count",
    "device_attributes",
    "device_count",
    "device_kind",
    "ensure_spmd",
    "global_mesh",
    "is_xla_tensor",
    "mirror_global_mesh",
    "optimization_barrier_",
    "platform",
    "push_scope",
    "require_torch_xla",
    "shard_alike",
    "step_functions",
    "sync",
    "sync_named",
    "sync_tensors",
    "tensors_hlo_text",
    "torch_xla_module",
]


MORE_DEVICES = (
    "call spmd.configure_default_devices(n) before torch_xla is imported (on CPU it sets CPU_NUM_DEVICES=n; "
    "without it torch_xla's CPU runtime has 1 device)"
)
"""How to run with more devices, for error messages (`ShardingBackend.more_devices`)."""


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


def platform() -> str:
    """The PJRT device type: ``CPU``, ``TPU``, ..."""
    xr = torch_xla_module("torch_xla.runtime")

    return str(xr.device_type())


def device_kind() -> str:
    """The accelerator's kind as XLA names it ("TPU v5 lite", "TPU7x", "cpu")."""
    xm = torch_xla_module("torch_xla.core.xla_model")

    return str(xm.xla_device_kind())


def device_attributes() -> list[dict]:
    """Per-device attributes of the runtime (``coords``, ``core_on_chip``, ``slice_index`` on
    TPU), in device id order: what `mesh.HybridMesh` orders devices by."""
    xr = torch_xla_module("torch_xla.runtime")

    return list(xr.global_runtime_device_attributes())


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


def step_functions() -> list[tuple[Any, str]]:
    """``(module, attribute)`` of the function that ends a step, ``torch_xla.sync``, for the
    inspector to wrap. ``xm.mark_step``, ``torch_xla.step()`` and ``MpDeviceLoader`` call it
    by that name, so wrapping it counts their steps too."""
    torch_xla = torch_xla_module()

    return [(torch_xla, "sync")]


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


def checkpoint(function: Any, *args: torch.Tensor) -> Any:
    """torch_xla's activation checkpointing: ``function(*args)`` runs without saving
    activations; backward puts an optimization barrier over the inputs and incoming gradients,
    then recomputes (so XLA cannot merge the recompute with the forward)."""
    xla_checkpoint = torch_xla_module("torch_xla.utils.checkpoint", "gradient checkpointing on GSPMD").checkpoint

    return xla_checkpoint(function, *args, use_reentrant=True)


def tensors_hlo_text(tensors: list[torch.Tensor]) -> str:
    """The unpartitioned HLO module that would compute ``tensors``."""
    return str(_xlac()._get_xla_tensors_hlo(tensors))


def optimization_barrier_(tensors: list[torch.Tensor]) -> None:
    """XLA's optimization barrier over ``tensors``, in place."""
    _xlac()._xla_optimization_barrier_(tensors)


def shard_alike(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """XLA's ``ShardAlike`` pair: ``x`` and ``y`` get one sharding, whichever GSPMD picks
    (through torch_xla's JAX bridge, as its ``shard_as``)."""
    from spmd._backend.torchax_import import import_torchax_bridge

    xb = torch_xla_module("torch_xla.core.xla_builder", "shard_as")
    import_torchax_bridge("shard_as")  # else torch_xla's own import of torchax fails without flax
    from jax.experimental.shard_alike import shard_alike as jax_shard_alike

    return xb.call_jax(jax_shard_alike, (x, y))


def is_pending(t: torch.Tensor) -> bool:
    """Whether ``t`` is a traced value not computed yet (its layout is the compiler's to choose
    until it runs), rather than data on the devices."""
    return bool(_xlac()._check_tensor_need_materialization([t])[0])
