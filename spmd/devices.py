"""Default devices: virtual CPU devices for laptops and CI, the real accelerator elsewhere.

`configure_default_devices` must run before torch_xla (or JAX) is imported. On a machine with
a TPU, or when ``PJRT_DEVICE`` is already set, it changes nothing, so a TPU VM user sets
nothing and gets the TPU.
"""

from __future__ import annotations

import glob
import os

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
    ``--xla_force_host_platform_device_count`` to ``XLA_FLAGS`` (JAX), each only if unset.
    On the CPU it also selects XLA's memory-minimizing scheduler
    (``--xla_cpu_enable_concurrency_optimized_scheduler=false``): the CPU default schedules
    for parallelism and starts every all-gather as early as it can, so all of an FSDP model's
    gathered weights would be alive at once. A TPU compile schedules under a memory limit;
    with this flag, memory measured on virtual CPU devices follows the same logic.

    Returns:
        The ``PJRT_DEVICE`` in effect (``"CPU"``, ``"TPU"``, ...).

    Raises:
        DeviceCountError: ``num_cpu_devices`` is not an int from 1 to `MAX_DEVICES` (torch_xla
            takes 0 and crashes at the first device use).
    """
    if (
        isinstance(num_cpu_devices, bool)
        or not isinstance(num_cpu_devices, int)
        or not 1 <= num_cpu_devices <= MAX_DEVICES
    ):
        from mesh.errors import DeviceCountError

        raise DeviceCountError(
            f"configure_default_devices(num_cpu_devices={num_cpu_devices!r:.40}): give a whole number of virtual CPU "
            f"devices from 1 to {MAX_DEVICES} (8 is the default)."
        )
    if "PJRT_DEVICE" not in os.environ:
        if has_tpu():
            os.environ["PJRT_DEVICE"] = "TPU"
        else:
            os.environ["PJRT_DEVICE"] = "CPU"
    if os.environ["PJRT_DEVICE"] == "CPU":
        os.environ.setdefault("CPU_NUM_DEVICES", str(num_cpu_devices))
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            count = os.environ["CPU_NUM_DEVICES"]
            flags = f"{flags} --xla_force_host_platform_device_count={count}".strip()
        if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
            flags = f"{flags} {MEMORY_AWARE_CPU_SCHEDULER}".strip()
        os.environ["XLA_FLAGS"] = flags
    return os.environ["PJRT_DEVICE"]


def enable_spmd() -> None:
    """Turn on torch_xla's SPMD mode; call it before any tensor is moved to the XLA device.

    `mark_sharding` turns it on by itself when no tensor is on the device yet.

    Raises:
        SpmdModeError: tensors were already placed on the device without SPMD mode.
    """
    from spmd._backend import backend

    backend.ensure_spmd()
