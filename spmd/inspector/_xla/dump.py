"""XLA's dump directory: turning dumps on, finding the compiled modules, reading them into
`GraphReport` values.

XLA reads ``XLA_FLAGS`` once per process, at torch_xla's first ``sync`` (measured with
torch_xla 2.9: setting ``--xla_dump_to`` after that dumps nothing, and pointing it elsewhere
is ignored). So dumps must be requested before the first step: `prepare` does it, the CLI
calls it before the user's script runs.
"""

from __future__ import annotations

import atexit
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from spmd._util.memory import MemoryUsage
from spmd.hlo import HloModuleText
from spmd.inspector._xla.graphs import GraphReport, ParameterInfo
from spmd.inspector.collectives import collectives_of

__all__ = ["prepare", "dump_dir_from_flags", "list_modules", "read_graph", "ParameterNamer"]

ParameterNamer = Callable[[ParameterInfo, list[str]], str]
"""``(info, op_names) -> name or ''``: ``op_names`` are the HLO ``op_name`` of the parameter
itself (its first use when traced) and of its nearest scoped users."""

_BEFORE_SUFFIX = ".before_optimizations.txt"
_MODULE_RE = re.compile(r"module_(\d+)\.")


def dump_dir_from_flags(flags: str | None = None) -> Path | None:
    """The ``--xla_dump_to`` directory in ``flags`` (default: ``$XLA_FLAGS``), or ``None``."""
    text = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    found = None
    for token in shlex.split(text):
        m = re.fullmatch(r"--xla_dump_to=(.+)", token)
        if m:
            found = Path(m.group(1))
    return found


def _as_path(value: object, name: str) -> Path:
    """``value`` as a Path, or a TypeError naming ``name``."""
    if not isinstance(value, (str, os.PathLike)) or "\x00" in str(value):
        raise TypeError(
            f"{name} must be a directory path (str or os.PathLike), got {type(value).__name__} {value!r:.60}."
        )
    return Path(value)


def _make_dump_dir(target: Path) -> None:
    """Create ``target``, or a ValueError naming it (an existing file, an unwritable parent...)."""
    if target.exists() and not target.is_dir():
        raise ValueError(
            f"prepare(): the dump directory {target} exists and is not a directory; give a directory path."
        )
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"prepare(): cannot create the dump directory {target} ({e.strerror}); give a writable path."
        ) from None


def _temporary_dump_dir() -> Path:
    """A new temp directory, removed at exit: dumps hold LLVM IR and objects, megabytes per graph."""
    path = Path(tempfile.mkdtemp(prefix="spmd-inspector-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def prepare(dump_dir: str | os.PathLike[str] | None = None) -> Path:
    """Ask XLA to dump every compiled graph as text, for the inspector to read.

    Call it before the process first uses the XLA device (``torch_xla.device()``, ``.to(device)``
    or a ``torch_xla.sync()``): XLA reads its flags then, once. Before torch_xla is imported is
    safest. If ``XLA_FLAGS`` already names a dump directory, that one is kept. A temporary
    directory it makes itself is removed when the process exits.
    Also sets ``XLA_HLO_DEBUG=1`` (unless set) so the HLO carries the Python source line and
    module scope of each op, which the report uses to name collectives.

    Args:
        dump_dir: where XLA writes; default a new temporary directory.

    Returns:
        The dump directory.

    Raises:
        TypeError: ``dump_dir`` is not a path.
        ValueError: ``XLA_FLAGS`` already dumps elsewhere, or the directory cannot be made (a
            file is there, the parent is not writable). ``XLA_FLAGS`` is then left unchanged.
    """
    if dump_dir is not None:
        dump_dir = _as_path(dump_dir, "prepare(dump_dir)")
    flags = os.environ.get("XLA_FLAGS", "")
    existing = dump_dir_from_flags(flags)
    if existing is not None and dump_dir is not None and Path(dump_dir) != existing:
        raise ValueError(
            f"XLA_FLAGS already dumps to {existing}; prepare(dump_dir={str(dump_dir)!r}) cannot point XLA "
            "elsewhere. Drop --xla_dump_to from XLA_FLAGS or call prepare() without a directory."
        )
    target = existing or Path(dump_dir or _temporary_dump_dir())
    _make_dump_dir(target)
    add = []
    if existing is None:
        add.append(f"--xla_dump_to={target}")
    if "--xla_dump_hlo_as_text" not in flags:
        add.append("--xla_dump_hlo_as_text")
    if add:
        os.environ["XLA_FLAGS"] = " ".join([flags, *add]).strip()
    os.environ.setdefault("XLA_HLO_DEBUG", "1")
    return target


def module_versions(dump_dir: str | os.PathLike[str]) -> dict[int, tuple[str, int]]:
    """``{module id: (file prefix, write time in ns)}`` of the compiled modules in ``dump_dir``
    (those with an optimized HLO file).

    XLA numbers modules from 0 in every process, so a directory used by an earlier run holds
    files of the same ids: the newest file of an id is its module, and its write time tells a
    module compiled now from one left by that run. One pass over the directory: XLA's CPU
    backend also dumps LLVM IR and object files for every kernel, so a long session's dump
    directory holds tens of thousands of files.
    """
    root = _as_path(dump_dir, "dump_dir")
    if not root.is_dir():
        return {}
    before: dict[int, tuple[str, int]] = {}
    optimized: dict[int, list[str]] = {}
    with os.scandir(root) as entries:
        for entry in entries:
            name = entry.name
            m = _MODULE_RE.match(name)
            if not m:
                continue
            module = int(m.group(1))
            if name.endswith(_BEFORE_SUFFIX):
                try:
                    written = entry.stat().st_mtime_ns
                except OSError:  # removed meanwhile
                    continue
                if module not in before or written > before[module][1]:
                    before[module] = (name[: -len(_BEFORE_SUFFIX)], written)
            elif name.endswith("after_optimizations.txt"):
                optimized.setdefault(module, []).append(name)
    out = {
        module: (prefix, written)
        for module, (prefix, written) in before.items()
        if any(n.startswith(prefix + ".") for n in optimized.get(module, ()))
    }
    return dict(sorted(out.items()))


def list_modules(dump_dir: str | os.PathLike[str]) -> dict[int, str]:
    """``{module id: file prefix}`` of the compiled modules in ``dump_dir`` (`module_versions`),
    e.g. ``{3: 'module_0003.SyncTensorsGraph.38'}``."""
    return {module: prefix for module, (prefix, _) in module_versions(dump_dir).items()}


def _after_file(root: Path, prefix: str) -> Path | None:
    for path in sorted(root.glob(f"{glob_escape(prefix)}.*after_optimizations.txt")):
        return path
    return None


def _buffer_file(root: Path, prefix: str) -> Path | None:
    for path in sorted(root.glob(f"{glob_escape(prefix)}.*after_optimizations-buffer-assignment.txt")):
        return path
    return None


def glob_escape(text: str) -> str:
    """``text`` with glob metacharacters escaped."""
    return re.sub(r"([\[\]*?])", r"[\1]", text)


def _module_id(prefix: object) -> int:
    """The module number of a dump prefix such as ``module_0003.SyncTensorsGraph.38``."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a dump name string, got {type(prefix).__name__} {prefix!r:.60}.")
    m = _MODULE_RE.match(prefix + ".")
    if not m:
        raise ValueError(
            f"{prefix!r:.80} is not a module's dump name: XLA names them module_NNNN.<graph> "
            "(list_modules(dump_dir) gives them)."
        )
    return int(m.group(1))


def read_graph(
    dump_dir: str | os.PathLike[str],
    prefix: str,
    *,
    step: int | None = None,
    namer: ParameterNamer | None = None,
) -> GraphReport:
    """Read one compiled module's dumps into a `GraphReport`.

    Raises:
        TypeError: ``dump_dir`` is not a path or ``prefix`` not a string.
        ValueError: ``prefix`` is not a module's dump name (``module_NNNN...``, `list_modules`).
        FileNotFoundError: the optimized HLO of ``prefix`` is not in ``dump_dir``.
    """
    root = _as_path(dump_dir, "dump_dir")
    module_id = _module_id(prefix)
    after_path = _after_file(root, prefix)
    if after_path is None:
        raise FileNotFoundError(f"No optimized HLO for {prefix} in {root}.")
    after = HloModuleText.parse(after_path.read_text())
    before_path = root / (prefix + _BEFORE_SUFFIX)
    before = HloModuleText.parse(before_path.read_text()) if before_path.exists() else None
    before_params = before.parameters() if before is not None else {}
    buffer_path = _buffer_file(root, prefix)
    memory = MemoryUsage.parse(buffer_path.read_text()) if buffer_path is not None else None

    params = []
    for number, inst in sorted(after.parameters().items()):
        arrays = inst.arrays
        if not arrays:
            continue
        global_inst = before_params.get(number)
        info = ParameterInfo(
            number=number,
            shape=arrays[0],
            global_shape=global_inst.arrays[0] if global_inst is not None and global_inst.arrays else None,
            sharding=inst.sharding or (global_inst.sharding if global_inst is not None else None) or "{replicated}",
        )
        if namer is not None:
            source = global_inst or inst
            module = before if global_inst is not None else after
            op_names = [source.metadata.get("op_name", ""), *module.scoped_uses(source)]  # type: ignore[union-attr]
            name = namer(info, op_names)
            if name:
                info = ParameterInfo(info.number, info.shape, info.global_shape, info.sharding, name)
        params.append(info)
    return GraphReport(
        name=after.name,
        module_id=module_id,
        num_partitions=after.num_partitions,
        memory=memory,
        parameters=tuple(params),
        collectives=tuple(collectives_of(after)),
        hlo_path=str(after_path),
        step=step,
    )
