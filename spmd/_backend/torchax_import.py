"""Importing torchax where its wheel's packaging or its device registration gets in the way.

Two users: torch_xla's JAX bridge (``xb.call_jax``, behind `shard_as`), which imports torchax
itself, and the planner (`spmd.plan._jax_compat.import_torchax`), which also needs ATen stand-ins on
current torch. Both need the two guards here:

- **torchax 0.0.13's wheel imports flax** at the top (checkpoint helpers neither user calls); a
  placeholder stands in while it imports, when flax is absent. Without it, on the torch_xla lane
  (no flax), torch_xla 2.9's ``shard_as`` raised "AssertionError: Jax is required for this
  feature" though jax and torchax are installed.
- **torchax registers PrivateUse1 as an available ``jax`` device**, which makes ``jax`` this
  process's accelerator (`no_accelerator_claim`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["flax_placeholder", "no_accelerator_claim", "import_torchax_bridge", "drop_stale_submodules"]


@contextlib.contextmanager
def flax_placeholder() -> Iterator[None]:
    """A bare ``flax`` while torchax 0.0.13's wheel imports it (module docstring), if flax is absent."""
    if importlib.util.find_spec("flax") is not None:
        yield
        return
    names = ("flax", "flax.training", "flax.training.checkpoints")
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["flax"].training = sys.modules["flax.training"]  # type: ignore[attr-defined]
    sys.modules["flax.training"].checkpoints = sys.modules["flax.training.checkpoints"]  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for name in names:
            sys.modules.pop(name, None)


@contextlib.contextmanager
def no_accelerator_claim() -> Iterator[None]:
    """Inside: torchax's import registers its device module for ``jax`` (torch's PrivateUse1)
    as a device that is not available.

    torchax names PrivateUse1 ``jax`` (its tensors' device) and registers a module whose
    ``is_available()`` is true, which makes ``jax`` this process's accelerator for the rest of
    its life with no device behind it: on torch 2.15 every later ``torch.optim.Adam(...).step()``
    raised "PyTorch is not linked with support for jax devices", and the dtensor backend would
    have put its DeviceMeshes on ``jax``. Not available, it is passed over as an accelerator;
    torchax's tensors keep their ``jax`` device."""
    from spmd._util.torch_compat import device_module_registration

    def register_unavailable(register: Any, name: str, module: Any) -> None:
        proxy = types.ModuleType(f"{module.__name__}_not_an_accelerator")
        proxy.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
        proxy.is_available = lambda: False  # type: ignore[attr-defined]
        register(name, proxy)

    with device_module_registration(register_unavailable):
        yield


def import_torchax_bridge(feature: str) -> None:
    """Import torchax and the parts of it torch_xla's JAX bridge uses, under both guards, so
    that torch_xla finds it already imported.

    Raises:
        TorchXlaNotInstalledError: jax or torchax is not installed (a ``ModuleNotFoundError``);
            the message names ``feature`` and what to install.
    """
    missing = [name for name in ("jax", "torchax") if importlib.util.find_spec(name) is None]
    if missing:
        from spmd.errors import TorchXlaNotInstalledError

        raise TorchXlaNotInstalledError(
            f"{feature} runs through torch_xla's JAX bridge, which needs {' and '.join(missing)}, not installed "
            "here: pip install 'xla-spmd[xla,plan]' (jax 0.7.1 and torchax 0.0.13 with torch_xla 2.9)."
        )
    names = ("torchax", "torchax.tensor", "torchax.interop", "torchax.ops.mappings")
    if all(name in sys.modules for name in names):
        return
    drop_stale_submodules()
    with flax_placeholder(), no_accelerator_claim():
        for name in names:
            importlib.import_module(name)


def drop_stale_submodules() -> None:
    """Before importing torchax: forget the submodules a failed import left behind.

    An import of torchax that failed on flax earlier (torch_xla tries one when its spmd package
    loads) leaves ``torchax.*`` submodules in ``sys.modules`` without the package; a new package
    would not get them as attributes (``module 'torchax' has no attribute 'ops'``, measured when
    the planner imported torchax before ``shard_as`` ran), so they are imported afresh."""
    if "torchax" not in sys.modules:
        for stale in [m for m in sys.modules if m.startswith("torchax.")]:
            del sys.modules[stale]
