"""Put a module back as it was when wrapping it fails part way.

`fully_shard` checks everything it can before the first change (`FSDPBackend.check`). What it
cannot check ahead runs while units are being sharded: the user's ``param_init_fn`` or a
module's ``reset_parameters`` raising on the third unit, torch's own ``fully_shard`` refusing a
unit, memory running out. Then the units already done are undone from a snapshot taken before
the first change, as `spmd.distribute_module` does, so a refused wrap leaves the model as it was
and a retry starts from the same model.

What is kept, per module: its class (units become FSDP classes), its attributes (the parameter,
buffer, submodule and hook dicts copied, so a replaced parameter or an added hook goes), and
for every tensor its data, device and sharding (a parameter may be moved or annotated in place).
FSDP2 also records each wrapped module in torch's registry of composable state; a rolled back
module is removed from it, or a retry would be refused as "already applied".
"""

from __future__ import annotations

from typing import Any

import torch

from spmd.backend import backend_for

__all__ = ["ModuleSnapshot"]


def _shallow(value: Any) -> Any:
    """A dict attribute (parameters, buffers, hooks) copied, so in-place additions do not reach it."""
    return type(value)(value) if isinstance(value, dict) else value


class ModuleSnapshot:
    """Every module of ``root`` and every tensor it holds, as they are now; `restore` puts them back."""

    def __init__(self, root: torch.nn.Module) -> None:
        first = next(iter(root.parameters()), None)
        self.backend = backend_for(first if first is not None else torch.empty(0))
        self.modules = [(m, type(m), {k: _shallow(v) for k, v in vars(m).items()}) for m in root.modules()]
        tensors = {
            id(t): t
            for m in root.modules()
            for t in (*m._parameters.values(), *m._buffers.values())
            if t is not None and not t.is_meta
        }
        self.tensors = [(t, t.data, self._sharding(t)) for t in tensors.values()]
        self.grads = [(t, t.grad) for t in tensors.values()]

    def _sharding(self, t: torch.Tensor) -> Any:
        try:
            return self.backend.sharding_of(t)
        except Exception:  # a tensor of another runtime than the first parameter's: it has none of ours
            return None

    def restore(self) -> None:
        """Undo everything done to the modules and tensors since the snapshot."""
        for module, cls, attrs in self.modules:
            module.__class__ = cls
            vars(module).clear()
            vars(module).update({k: _shallow(v) for k, v in attrs.items()})
            _forget_composable_state(module)
        for t, data, sharding in self.tensors:
            if sharding is None and self._sharding(t) is not None:
                self.backend.clear(t)  # annotated in place (torch_xla)
            if t.device != data.device or t.shape != data.shape or t.dtype != data.dtype:
                t.data = data  # moved or resized in place
        for t, grad in self.grads:
            t.grad = grad


def _forget_composable_state(module: torch.nn.Module) -> None:
    """Drop ``module`` from torch's registry of composable APIs' state (FSDP2 adds it there)."""
    try:
        from spmd.torch_compat import composable_state as _composable_state
    except ImportError:  # a torch without it has no state to forget
        return
    _composable_state._module_state_mapping.pop(module, None)
