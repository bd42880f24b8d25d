"""Public classes named by their public path.

Reprs, pickles and docs should name ``mesh.Mesh``, not the private module that defines it (jax
sets ``NamedSharding.__module__ = "jax.sharding"``). Moving ``__module__`` alone breaks
``typing.get_type_hints``, which evaluates a class's string annotations in the namespace of the
module ``__module__`` names: the facade does not hold the private module's imports (transformers
calls it on every ``PreTrainedModel`` subclass, so FSDP units of a Hugging Face model failed to
build). `publish` resolves each class's own annotations where it was defined, then renames it.
"""

from __future__ import annotations

import sys

__all__ = ["publish"]


def publish(module_name: str, *classes: type) -> None:
    """Give ``classes`` the public ``__module__`` ``module_name``, their own annotations resolved
    first in the module that defined them (pickles naming that module still load)."""
    for cls in classes:
        own = cls.__dict__.get("__annotations__", {})
        if own:
            defined_in = vars(sys.modules[cls.__module__])
            cls.__annotations__ = {name: _resolved(value, defined_in, cls) for name, value in own.items()}
        cls.__module__ = module_name


def _resolved(annotation: object, defined_in: dict, cls: type) -> object:
    """A string annotation evaluated where its class was defined; one naming what that module
    imports only for type checkers stays a string (as it was)."""
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, defined_in, dict(vars(cls)))  # noqa: S307 (our own annotations)
    except NameError:
        return annotation
