"""Default devices: virtual CPU devices for laptops and CI, the real accelerator elsewhere.

`configure_default_devices` must run before torch_xla (or JAX) is imported. On a machine with
a TPU, or when ``PJRT_DEVICE`` is already set, it changes nothing, so a TPU VM user sets
nothing and gets the TPU.
"""

from __future__ import annotations

import glob
import os
import sys

from mesh.checks import is_int

__all__ = ["MAX_DEVICES", "configure_default_devices", "enable_spmd", "has_tpu"]

MAX_DEVICES = 4096
"""The most virtual CPU devices asked for (a TPU pod's largest slice has 9,216 Ironwood chips;
more virtual devices than this on one host is a typo)."""

_GOOGLE_PCI_VENDOR = "0x1ae0"
MEMORY_AWARE_CPU_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def has_tpu() -> bool:
    """Whether this host has TPU chips (PCI vendor Google, or /dev/accel* / /dev/vfio)."""
    for vendor_file in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor_file) as f:
                if f.read().strip() == _GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return bool(glob.glob("/dev/accel[0-9]*"))


def configure_default_devices(num_cpu_devices: int = 8) -> str:
    """Give torch_xla and JAX ``num_cpu_devices`` virtual CPU devices unless a device is chosen.

    Sets ``PJRT_DEVICE=CPU``, ``CPU_NUM_DEVICES`` (torch_xla) and adds
    ``--xla_force_host_platform_device_count`` to ``XLA_FLAGS`` (JAX), each only if unset (a
    ``CPU_NUM_DEVICES`` from the environment, or from an earlier call, wins).
    On the CPU it also selects XLA's memory-minimizing scheduler
    (``--xla_cpu_enable_concurrency_optimized_scheduler=false``): the CPU default schedules
    for parallelism and starts every all-gather as early as it can, so all of an FSDP model's
    gathered weights would be alive at once. A TPU compile schedules under a memory limit;
    with this flag, memory measured on virtual CPU devices follows the same logic.

    Returns:
        The ``PJRT_DEVICE`` in effect (``"CPU"``, ``"TPU"``, ...).

    Raises:
        DeviceCountError: ``num_cpu_devices`` is not an int from 1 to `MAX_DEVICES` (torch_xla
            takes 0 and crashes at the first device use); ``CPU_NUM_DEVICES`` in the environment
            is not one either; or torch_xla or JAX already started with another count (the call
            would have no effect).
    """
    count = _device_count_arg(num_cpu_devices, f"configure_default_devices(num_cpu_devices={num_cpu_devices!r:.40})")
    if "PJRT_DEVICE" not in os.environ:
        if has_tpu():
            os.environ["PJRT_DEVICE"] = "TPU"
        else:
            os.environ["PJRT_DEVICE"] = "CPU"
    if os.environ["PJRT_DEVICE"] == "CPU":
        _set_cpu_device_count(count)
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            flags = f"{flags} {_HOST_COUNT_FLAG}={os.environ['CPU_NUM_DEVICES']}".strip()
        if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
            flags = f"{flags} {MEMORY_AWARE_CPU_SCHEDULER}".strip()
        os.environ["XLA_FLAGS"] = flags
    return os.environ["PJRT_DEVICE"]


_HOST_COUNT_FLAG = "--xla_force_host_platform_device_count"


def _device_count_arg(value: object, where: str) -> int:
    if not is_int(value) or not 1 <= value <= MAX_DEVICES:
        from mesh.errors import DeviceCountError

        raise DeviceCountError(
            f"{where}: give a whole number of virtual CPU devices from 1 to {MAX_DEVICES} (8 is the default)."
        )
    return int(value)


def _set_cpu_device_count(count: int) -> None:
    """``CPU_NUM_DEVICES=count`` unless a count is set (the environment's, or an earlier call's: the
    first wins, so a script's own call does not undo ``python -m spmd.inspector --devices n``).
    A count already set is checked (torch_xla crashes on 0 or a non-number), and refused when a
    runtime already started with it and this call asks for another (it would have no effect)."""
    current = os.environ.get("CPU_NUM_DEVICES")
    if current is None:
        os.environ["CPU_NUM_DEVICES"] = str(count)
        return
    text = current.strip()
    started_with = _device_count_arg(
        int(text) if text.isdigit() else current,
        f"CPU_NUM_DEVICES={current!r:.40} in the environment (torch_xla's virtual CPU device count; set it right, "
        f"or unset it for {count})",
    )
    if started_with != count and _runtime_started():
        from mesh.errors import DeviceCountError

        raise DeviceCountError(
            f"configure_default_devices({count}): the runtime already started with {started_with} virtual CPU "
            f"devices (CPU_NUM_DEVICES={current}, from the environment or an earlier call), and its device count "
            f"cannot change now. Call configure_default_devices({count}) first thing in the program, before torch_xla "
            "or JAX is imported (and with no CPU_NUM_DEVICES in the environment)."
        )


def _runtime_started() -> bool:
    """Whether torch_xla's or JAX's runtime already read its device count (neither is imported here)."""
    xlac = getattr(sys.modules.get("torch_xla"), "_XLAC", None)
    if xlac is not None and xlac._xla_runtime_is_initialized():
        return True
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bridge is not None and bool(getattr(bridge, "backends_are_initialized", lambda: False)())


def enable_spmd() -> None:
    """Turn on torch_xla's SPMD mode; call it before any tensor is moved to the XLA device.

    `mark_sharding` turns it on by itself when no tensor is on the device yet.

    Raises:
        SpmdModeError: tensors were already placed on the device without SPMD mode.
    """
    from spmd._backend import torch_xla_backend

    torch_xla_backend.ensure_spmd()
