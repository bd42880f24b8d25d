"""`capture`: inspect the graphs compiled inside a ``with`` block, in the running process.

While the block runs, every ``torch_xla.sync()`` is counted as the end of a step, and every
``nn.Module`` call opens a scope named by the module's path (``transformer.h.0.attn``), which
XLA_HLO_DEBUG=1 writes into the HLO so the report can name parameters and collectives. Both
are undone when the block ends.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from spmd._backend import torch_xla_backend
from spmd.inspector._xla.dump import dump_dir_from_flags, list_modules, module_versions, prepare, read_graph
from spmd.inspector.checks import CheckOptions, find_issues
from spmd.inspector.collectives import module_scope
from spmd.inspector.report import ParameterInfo, Report

__all__ = ["InspectorError", "Capture", "capture"]


class InspectorError(RuntimeError):
    """The inspector cannot produce a report (XLA is not dumping, or nothing was compiled)."""


class _ModuleScopes:
    """Global forward hooks that open an XLA scope per module call, named by module path."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self.modules: dict[str, torch.nn.Module] = {}
        self._stack: list[Any] = []
        self._handles: list[Any] = []

    def _name(self, module: torch.nn.Module) -> str:
        key = id(module)
        if key not in self._names:
            root = type(module).__name__
            for qualified, sub in module.named_modules():
                name = qualified or root
                self._names.setdefault(id(sub), name)
                self.modules.setdefault(name, sub)
        return self._names[key]

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        self._stack.append(torch_xla_backend.push_scope(self._name(module)))

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def __enter__(self) -> _ModuleScopes:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        # always_call: a forward that raises (and is caught by the script) still closes its
        # scope, or torch_xla's next sync fails on the scope left open.
        self._handles = [
            register_module_forward_pre_hook(self._pre),
            register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        while self._stack:
            self._stack.pop()

    def name_parameter(self, info: ParameterInfo, op_names: list[str]) -> str:
        """The tensor behind an HLO parameter, from the module scopes of its first use and of
        the ops that read it: a tensor of its global shape held by that module, else by one
        of its submodules (a wrapper such as an FSDP unit reads its children's weights).

        Only each op's innermost module scope is searched, so an input or an optimizer state
        is not mistaken for an outer module's weight of the same shape; more than three
        candidates name nothing.
        """
        dims = (info.global_shape or info.shape).dims
        for group in (op_names[:1], op_names[1:]):
            scopes = []
            for op_name in group:
                scope = module_scope(op_name)
                if scope in self.modules and scope not in scopes:
                    scopes.append(scope)
            for recurse in (False, True):
                found: list[str] = []
                for scope in scopes:
                    module = self.modules[scope]
                    tensors = list(module.named_parameters(recurse=recurse)) + list(
                        module.named_buffers(recurse=recurse)
                    )
                    for n, t in tensors:
                        name = f"{scope}.{n}"
                        if tuple(t.shape) == dims and name not in found:
                            found.append(name)
                if 0 < len(found) <= 3:
                    return " or ".join(found)
                if found:
                    return ""
        return ""


class _StepRecorder:
    """Wraps ``torch_xla.sync`` to attribute each newly compiled module to a step."""

    def __init__(self, dump_dir: Path) -> None:
        self.dump_dir = dump_dir
        # What the directory held before the block, by id and file version: a module compiled
        # inside the block is a new id, or an id whose files were written anew (a directory
        # reused by an earlier run, whose module numbers this process repeats).
        self.known = module_versions(dump_dir)
        self.steps: dict[int, list[int]] = {}
        self.syncs = 0
        self._saved: list[tuple[Any, str, Any]] = []

    def collect(self, step: int) -> None:
        new = {m: v for m, v in module_versions(self.dump_dir).items() if self.known.get(m) != v}
        if new:
            self.steps.setdefault(step, []).extend(new)
            self.known.update(new)

    def _wrap(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def counted_sync(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                # Everything compiled since the previous sync, mid-step executions (.item())
                # included, belongs to the step this sync ends: one listing finds it all.
                self.collect(self.syncs)
                self.syncs += 1

        counted_sync.__wrapped_by_inspector__ = True  # type: ignore[attr-defined]
        return counted_sync

    def __enter__(self) -> _StepRecorder:
        for owner, attr in torch_xla_backend.step_functions():
            fn = getattr(owner, attr)
            self._saved.append((owner, attr, fn))
            setattr(owner, attr, self._wrap(fn))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, fn in reversed(self._saved):
            setattr(owner, attr, fn)
        self._saved.clear()
        self.collect(self.syncs)


class Capture:
    """The handle ``capture()`` yields; once the block ends, ``.report`` holds the `Report`,
    and the report's attributes (``graphs``, ``warnings``, ``table()``, ``write_json()``) can
    be read from the handle directly."""

    def __init__(self) -> None:
        self._report: Report | None = None
        self._failure: str | None = None

    @property
    def report(self) -> Report:
        """The report (available after the ``with`` block)."""
        if self._failure is not None:
            raise InspectorError(f"capture() produced no report: {self._failure}")
        if self._report is None:
            raise InspectorError("The report is ready when the `with spmd.inspector.capture()` block has ended.")
        return self._report

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.report, name)


_NOT_DUMPING = (
    "XLA compiled {compiled} graph(s) inside capture() but wrote no dump to {dump_dir}: XLA reads "
    "XLA_FLAGS once per process, when the XLA device is first used (torch_xla.device(), .to(device) "
    "or a torch_xla.sync()), and this process used it before dumps to this directory were requested. "
    "Either run the script under the inspector, `python -m spmd.inspector SCRIPT [ARGS]`, or call "
    "`spmd.inspector.prepare()` at the top of the script, before the device is first used (before "
    "`import torch_xla`, to also get module names)."
)

_NOTHING_COMPILED = (
    "No graph was compiled inside capture(), so there is nothing to report. torch_xla reuses a "
    "graph it compiled before (capture the first run of the step), and compiles only at "
    "torch_xla.sync() (end the block with torch_xla.sync())."
)


@contextmanager
def capture(
    *,
    ignore: Sequence[str] = (),
    replicated_threshold_bytes: int = 1 << 20,
    warmup_steps: int = 2,
    name_modules: bool = True,
) -> Iterator[Capture]:
    """Report per-device memory and collectives of the graphs compiled inside the block.

    Example::

        spmd.inspector.prepare()        # top of the script, before the first sync
        ...
        with spmd.inspector.capture() as report:
            loss = model(x).sum(); loss.backward(); optimizer.step()
            torch_xla.sync()
        print(report.table())

    Args:
        ignore: warning codes to leave out (see `WarningCode`): a list, or one code.
        replicated_threshold_bytes: warn about replicated tensors at least this large.
        warmup_steps: steps (``torch_xla.sync()`` calls) inside the block that may compile
            without a recompilation warning.
        name_modules: open a scope per module call so parameters and collectives are named.

    If the block raises, the report still holds the graphs compiled before that, marked
    ``partial``, and the exception propagates.

    Raises:
        TypeError, ValueError: an option of the wrong type or out of range (before the block runs).
        InspectorError: at the end of the block, if XLA wrote no dumps (dumping was requested
            too late) or nothing was compiled.
        TorchXlaNotInstalledError: torch_xla is not installed (the current lane).
    """
    torch_xla_backend.require_torch_xla("spmd.inspector.capture (it reads XLA's dumps of torch_xla's programs)")
    options = CheckOptions(replicated_threshold_bytes, warmup_steps, ignore)  # type: ignore[arg-type]
    if not isinstance(name_modules, bool):
        raise TypeError(f"capture(name_modules=...) takes True or False, got {name_modules!r:.60}.")
    dump_dir = dump_dir_from_flags() or prepare()
    dump_dir.mkdir(parents=True, exist_ok=True)
    handle = Capture()
    compiled_before = torch_xla_backend.compile_count() if "torch_xla" in sys.modules else 0
    recorder = _StepRecorder(dump_dir)
    scopes = _ModuleScopes()
    error: BaseException | None = None
    with recorder:
        try:
            if name_modules:
                with scopes:
                    yield handle
            else:
                yield handle
        except BaseException as e:  # noqa: BLE001 - report what compiled, then re-raise it
            error = e
    compiled = torch_xla_backend.compile_count() - compiled_before
    _finish(handle, recorder, dump_dir, scopes.name_parameter if name_modules else None, options, compiled, error)
    if error is not None:
        raise error


def _finish(
    handle: Capture,
    recorder: _StepRecorder,
    dump_dir: Path,
    namer: Any,
    options: CheckOptions,
    compiled: int,
    error: BaseException | None,
) -> None:
    """Read the graphs the block compiled into ``handle``'s report (or its failure)."""
    prefixes = list_modules(dump_dir)
    graph_steps = {m: step for step, modules in recorder.steps.items() for m in modules}
    if not graph_steps:
        handle._failure = _NOT_DUMPING.format(compiled=compiled, dump_dir=dump_dir) if compiled else _NOTHING_COMPILED
        if error is not None:
            return
        raise InspectorError(handle._failure)
    graphs = tuple(read_graph(dump_dir, prefixes[m], step=graph_steps[m], namer=namer) for m in sorted(graph_steps))
    steps = {s: tuple(ms) for s, ms in recorder.steps.items()}
    partial = "" if error is None else f"the block raised {type(error).__name__}" + (f": {error}" if str(error) else "")
    handle._report = Report(
        graphs=graphs,
        warnings=find_issues(graphs, steps, options),
        devices=torch_xla_backend.device_count(),
        platform=torch_xla_backend.platform(),
        steps=steps,
        dump_dir=str(dump_dir),
        partial=partial,
    )
