"""The only runtime queries of the mesh package: device count and device attributes."""

from __future__ import annotations

__all__ = ["runtime_device_count", "runtime_device_attributes"]


def runtime_device_count() -> int:
    """The number of devices the torch_xla runtime sees (all hosts)."""
    import torch_xla.runtime as xr  # imported here: building a Mesh must not start a runtime

    return int(xr.global_runtime_device_count())


def runtime_device_attributes() -> list[dict]:
    """Per-device attributes (``coords``, ``core_on_chip``, ``slice_index`` on TPU)."""
    import torch_xla.runtime as xr

    return list(xr.global_runtime_device_attributes())
