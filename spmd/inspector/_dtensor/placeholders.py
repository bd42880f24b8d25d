"""Data-dependent calls in a dry run: ``loss.item()``, ``bool(t)``, ``float(t)``, ``t.tolist()``
need values a fake tensor does not have. Rather than stop the run at a logging line, each returns
a placeholder (zero, False) and the report lists where the script asked for one."""

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

    def __enter__(self) -> Placeholders:
        from spmd._util.torch_compat import FakeTensor

        self._saved_tolist = FakeTensor.__dict__.get("tolist")
        FakeTensor.tolist = lambda tensor: self._tolist(tensor)  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        from spmd._util.torch_compat import FakeTensor

        if self._saved_tolist is not None:
            FakeTensor.tolist = self._saved_tolist  # type: ignore[method-assign]
        else:
            del FakeTensor.tolist
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
