"""Data-dependent calls in a dry run: ``loss.item()``, ``bool(t)``, ``float(t)``, ``t.tolist()``
need values a fake tensor does not have. Rather than stop the run at a logging line, each returns
a placeholder (zero, False) and the report lists where the script asked for one.

Printing one (``print(loss)``, ``str``, ``f"{loss}"``) reads its value too: it prints the fake
tensor (``FakeTensor(..., size=())``), and ``f"{loss:.4f}"`` (torch formats a 0-d tensor's
value; a fake one has none) formats the placeholder; both are listed with the script's line.
Printing from torch's own code (an error message naming a tensor) is not the script's read
and is not listed."""

from __future__ import annotations

import sys
import traceback
from collections import Counter
from typing import Any

import torch

from spmd._util.torch_compat import TorchDispatchMode
from spmd.inspector._runner import is_user_file, script_line

__all__ = ["Placeholders", "user_line"]


def user_line(frames: list[traceback.FrameSummary] | None = None) -> str:
    """``'train.py:42'``: the innermost frame of the script's own code (not torch's, not ours).
    Without ``frames``, the running stack, walked frame by frame: a library's loop can read
    tens of thousands of placeholders (``tolist()`` of a gathered tensor), and formatting the
    whole stack for each took most of a dry run."""
    if frames is not None:
        return script_line(frames)
    frame = sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _placeholder(func: Any, args: tuple) -> Any:
    """Zero of the type the op returns: False for ``equal`` and bool tensors, 0 for integer
    tensors, else 0.0."""
    tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if func is torch.ops.aten.equal.default or (tensor is not None and tensor.dtype is torch.bool):
        return False
    if tensor is not None and not tensor.dtype.is_floating_point and not tensor.dtype.is_complex:
        return 0
    return 0.0


class Placeholders(TorchDispatchMode):
    """Answers data-dependent ops on fake tensors with a placeholder; ``lines`` counts them by
    script line (``{'train.py:42': 2}``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: Counter[str] = Counter()

    def _tolist(self, tensor: Any) -> Any:
        """``FakeTensor.tolist`` in one go: the placeholders of every element, one line recorded
        per call (the fake tensor's own reads each element, about 0.3 ms apiece: 65,536 of them
        for a 1,024-rank gather of 64 values)."""
        self.lines[user_line() or "(library code)"] += 1
        zero = _placeholder(torch.ops.aten._local_scalar_dense.default, (tensor,))

        def nested(shape: tuple[int, ...]) -> Any:
            return zero if not shape else [nested(shape[1:]) for _ in range(shape[0])]

        return nested(tuple(tensor.shape))

    def _repr(self, tensor: Any, **kwargs: Any) -> str:
        """The fake tensor printed as torch prints it; a read of its value when the script prints it."""
        line = user_line()
        if line:
            self.lines[line] += 1
        return torch.Tensor.__repr__(tensor, **kwargs)

    def _format(self, tensor: Any, spec: str) -> str:
        """``f"{loss:.4f}"``: torch formats a 0-d tensor's value (here the placeholder's), any
        other tensor as its ``str`` (and refuses a format spec for it, as for a real one)."""
        if tensor.dim() != 0 or not spec:
            return object.__format__(tensor, spec)
        self.lines[user_line() or "(library code)"] += 1
        return format(_placeholder(torch.ops.aten._local_scalar_dense.default, (tensor,)), spec)

    def __enter__(self) -> Placeholders:
        from spmd._util.torch_compat import FakeTensor

        replacements = {
            "tolist": lambda tensor: self._tolist(tensor),
            "__repr__": lambda tensor, **kwargs: self._repr(tensor, **kwargs),
            "__format__": lambda tensor, spec: self._format(tensor, spec),
        }
        self._saved = {name: FakeTensor.__dict__.get(name) for name in replacements}
        for name, replacement in replacements.items():
            setattr(FakeTensor, name, replacement)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        from spmd._util.torch_compat import FakeTensor

        for name, saved in self._saved.items():
            if saved is not None:
                setattr(FakeTensor, name, saved)
            else:
                delattr(FakeTensor, name)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        from spmd._util.torch_compat import DataDependentOutputException, FakeTensor, unset_fake_temporarily

        try:
            return func(*args, **(kwargs or {}))
        except DataDependentOutputException:
            if func not in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.equal.default):
                raise
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if tensors and not any(isinstance(t, FakeTensor) for t in tensors):
                # A real tensor has its values: a DeviceMesh's ranks (built outside the fake mode),
                # read by code that converts a DeviceMesh (``mesh.tolist()``), are topology.
                with unset_fake_temporarily():
                    return func(*args, **(kwargs or {}))
            self.lines[user_line() or "(library code)"] += 1
            return _placeholder(func, args)
