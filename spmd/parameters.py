"""`shard_parameters`: lay a module's parameters out over a mesh, in place, on either backend.

On torch_xla a parameter is sharded in place (`mark_sharding` annotates the very tensor). On
DTensor, sharding makes a new tensor (a ``DTensor``), so the module's parameter must be replaced
by it; and every tensor a forward combines with a DTensor must be a DTensor too, so parameters
without a spec become replicated DTensors and so do buffers. This one call does what each
backend needs, so the same training script runs on both (``examples/train_spmd.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

import torch

from mesh import Mesh
from spmd._backend import backend_for
from spmd._backend.agreement import SAME_SHARDING, agree, mesh_text, spec_text
from spmd.errors import ShardingError, SpmdTypeError
from spmd.mark_sharding import SpecLike, resolve_sharding
from spmd.sharding import PartitionSpec

__all__ = ["shard_parameters"]

SpecFor = Mapping[str, SpecLike] | Callable[[str, torch.nn.Parameter], SpecLike | None]


def shard_parameters(module: torch.nn.Module, mesh: Mesh | None, specs: SpecFor) -> torch.nn.Module:
    """Shard ``module``'s parameters over ``mesh`` in place; returns ``module``.

    Args:
        module: the model; its parameters on the XLA device (torch_xla), or on this process's
            device in a torchrun job (dtensor backend).
        mesh: the mesh; ``None`` uses the global mesh.
        specs: ``{qualified parameter name: spec}``, or a function ``(name, parameter) ->
            spec or None``. A parameter with no spec is replicated. A tied parameter is
            sharded once, under its first name.

    On torch_xla each parameter stays the same ``nn.Parameter`` (sharded in place); on the
    dtensor backend each parameter and buffer is replaced by a ``DTensor`` (replicated when it
    has no spec), so build the optimizer after this call.

    Raises:
        SpmdTypeError: ``module`` is not an ``nn.Module``, or ``specs`` is neither a mapping nor
            a function.
        ShardingError: ``specs`` names parameters the module does not have, or a spec does not
            fit its parameter (from `mark_sharding`). Every spec is checked before any
            parameter is sharded, so a refused call leaves the module as it was.
    """
    if not isinstance(module, torch.nn.Module):
        raise SpmdTypeError(f"shard_parameters takes an nn.Module, got {type(module).__name__}.")
    spec_of = _spec_function(module, specs)
    params = list(module.named_parameters())
    if not params:
        return module
    backend = backend_for(params[0][1])
    specs_given = [(name, p, spec_of(name, p)) for name, p in params]  # each parameter once, under its first name
    _agree(backend, module, mesh, specs_given)
    resolved = []  # every spec checked (against its parameter, the mesh and the devices) before any is applied
    for _, p, spec in specs_given:
        sharding, hlo = resolve_sharding(
            p, mesh, PartitionSpec() if spec is None else spec, "shard_parameters", backend
        )
        resolved.append((p, sharding, hlo, spec is not None))
    new = {id(p): backend.parameter(p, sharding, hlo, specified=given) for p, sharding, hlo, given in resolved}
    for sub in module.modules():
        for attr, p in sub._parameters.items():
            if p is not None and new[id(p)] is not p:
                sub._parameters[attr] = new[id(p)]
        for attr, b in sub._buffers.items():
            if b is not None:
                sub._buffers[attr] = backend.buffer(b, sharding.mesh)
    return module


def _spec_function(module: torch.nn.Module, specs: SpecFor) -> Callable[[str, torch.nn.Parameter], SpecLike | None]:
    """``specs`` as a function of (name, parameter), a mapping's names checked against the module."""
    if isinstance(specs, Mapping):
        names = {name for name, _ in module.named_parameters()}
        unknown = sorted(set(specs) - names)
        if unknown:
            raise ShardingError(
                f"shard_parameters: {type(module).__name__} has no parameters {unknown}; its parameters are "
                f"{sorted(names)}. Use qualified names as named_parameters() gives them."
            )
        return lambda name, _: specs.get(name)
    elif isinstance(specs, torch.nn.Module):  # callable, but a module's forward is no spec function
        raise SpmdTypeError(
            f"shard_parameters: specs is a module ({type(specs).__name__}); the order is shard_parameters(module, mesh, "
            "specs), specs a mapping {name: spec} or a function (name, parameter) -> spec."
        )
    elif callable(specs):
        try:
            inspect.signature(specs).bind("name", None)
        except TypeError:
            raise SpmdTypeError(
                f"shard_parameters: the specs function {getattr(specs, '__name__', specs)!r:.60} must take two "
                "arguments (name, parameter) and return a spec or None."
            ) from None
        except ValueError:  # no signature to read (a builtin): call it as given
            pass
        return specs
    else:
        raise SpmdTypeError(
            f"shard_parameters: specs must be a mapping {{name: spec}} or a function (name, parameter) -> spec, "
            f"got {type(specs).__name__}."
        )


def _agree(backend: object, module: torch.nn.Module, mesh: object, specs: list) -> None:
    """One exchange for the whole module (not one per parameter): every rank lays out the same
    parameters and buffers, of the same shapes and dtypes, as the same specs, on one mesh."""
    if getattr(backend, "name", None) != "dtensor":
        return
    fields = {
        "mesh": mesh_text(mesh),
        "parameters": ", ".join(f"{n} {tuple(p.shape)} {str(p.dtype).removeprefix('torch.')}" for n, p, _ in specs),
        "specs": ", ".join(f"{n}: {'unsharded' if s is None else spec_text(s)}" for n, _, s in specs),
        "buffers": ", ".join(
            f"{n} {tuple(b.shape)} {str(b.dtype).removeprefix('torch.')}" for n, b in module.named_buffers()
        ),
    }
    agree(backend, "shard_parameters", fields, SAME_SHARDING)
