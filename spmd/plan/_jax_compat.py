"""Version drift under the planner, in one place (the jax compat home; torch's is
`spmd._util.torch_compat`, and `spmd.compat` is torch_xla's public names): torchax on current torch, libtpu's chips, how
jax lays devices out for a mesh, and reading what jax compiled. Nothing else in `spmd.plan`
checks a version.

The planner runs on two lanes (docs/plan.md): torch 2.9 with jax 0.7.1 and libtpu 0.0.20 (the
torch_xla lane), and torch 2.15 with jax 0.10.2 (Python 3.11) or 0.12 (Python 3.12 and 3.13)
and libtpu >= 0.0.50 (the current lane). What differs, measured here:

- **torchax 0.0.13 on torch >= 2.14.** torchax, the newest on PyPI, resolves ATen names that
  torch removed (the named-tensor ``Dimname`` overloads, ``aten.cholesky``, ``aten.qr``), in two
  places: when it is imported (its op table, its autocast table) and when its first
  ``Environment`` loads its decompositions. `import_torchax` gives a stand-in for each missing
  name during both, and removes them afterwards (23 on torch 2.15.0: 2 operators and 21
  overloads). A stand-in can only be reached through torchax's own tables, never by torch's
  dispatcher; if anything calls one, it raises `StandInReachedError`.
- **torchax 0.0.13's wheel imports flax** at the top (checkpoint helpers the planner never
  calls); a placeholder stands in while it imports, when flax is absent; it and the guard on
  torchax's device registration live in `spmd._backend.torchax_import` (shard_as needs them too).
- **libtpu 0.0.20** knows no ``tpu7x`` (Ironwood): "Invalid TPU external name". `topology_devices`
  turns that into `CompilerVersionError` naming the current lane.
- **The mesh's device order** is jax's (``mesh_utils.create_device_mesh``), whichever jax is
  installed, and every report says which (`device_order`). jax 0.12 gives TPU7x's core axis (the
  two TensorCores of a chip, the fastest links) to the busiest mesh axis first (jax PR 39340);
  0.10.2 treats it like x, y and z. So on ``tpu7x:2x4x4`` a ``fsdp=32, tensor=2`` mesh pairs the
  two cores of each chip on ``tensor`` under jax 0.12, and chips along x under 0.10.2 (slices of
  up to 32 devices follow jax's ring rule under both). jax 0.12 also gives ``v5p:2x2x2`` its
  8-chip ring ("TPU v5" devices), which 0.10.2 did not.
- **torchax's builds**: two builds both named 0.0.13 differ in ``override_op_definition``
  (`override_function`).
- **jax 0.7.1 with libtpu 0.0.20** (the torch_xla lane): jax writes Mosaic IR (Pallas kernels:
  splash attention) version 8, libtpu reads <= 7; `mosaic_ir_for_libtpu` asks for 7.
- **A scan's carries in a jaxpr**: jax <= 0.10 gives the ``scan`` primitive a ``num_carry``
  parameter; jax 0.12 gives it ``ft_out``, a flat tree of ``(carries, stacked outputs)``.
  `scan_stacked_outputs` reads either.
- **jaxlib 0.10.2 with libtpu 0.0.52**: ``compiled.as_text()`` can fail inside jaxlib
  ("async-update instruction should have 1 operands but sees 4"): jaxlib parses HLO older than
  what libtpu emits. XLA's own dump of the optimized module has the whole text, so
  `compile_with_hlo` reads that, on both lanes.

What else jax 0.12 changed, and why nothing here handles it: ``jax.make_mesh(axis_shapes=)`` is
now ``axis_sizes``, ``with mesh:`` is deprecated for ``jax.set_mesh``, and the float flags
``jax_exec_time_optimization_effort`` and ``jax_memory_fitting_effort`` are gone; the project
uses none of the three (it builds ``jax.sharding.Mesh`` from `device_mesh` and passes meshes
explicitly). ``jax[tpu]==0.12.0.1`` pins libtpu 0.0.50.*; the current lane names jax and libtpu
separately (libtpu >= 0.0.50), as it did for 0.10.2, whose ``[tpu]`` extra pinned 0.0.42.

It is also the one home of the private jax symbols the product imports (``jax._src.*``):
`PRIVATE_SYMBOLS` names each once, callers import it from here by that name, and it is imported
on first use; tests/test_private_upstream.py resolves each on both lanes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spmd._backend.torchax_import import drop_stale_submodules
from spmd._backend.torchax_import import flax_placeholder as _flax_placeholder
from spmd._backend.torchax_import import no_accelerator_claim as _no_accelerator_claim
from spmd._util.held_stderr import held_stderr
from spmd._util.private_symbols import PrivateSymbol, resolver
from spmd.plan.errors import CompilerVersionError, StandInReachedError, TopologyError

__all__ = [
    "PRIVATE_SYMBOLS",
    "LIBTPU_FOR_TPU7X",
    "TORCHAX_REMOVED_OPERATORS",
    "TORCHAX_REMOVED_OVERLOADS",
    "Toolchain",
    "aten_stand_ins",
    "compile_with_hlo",
    "core_axis_first",
    "device_mesh",
    "device_order",
    "import_torchax",
    "missing_aten_names",
    "mosaic_ir_for_libtpu",
    "override_function",
    "toolchain",
    "topology_devices",
]

PRIVATE_SYMBOLS: dict[str, PrivateSymbol] = {
    # the Mosaic IR version Pallas kernels are written in (`mosaic_ir_for_libtpu`)
    "tpu_custom_call": PrivateSymbol("jax._src.tpu_custom_call"),
    # compiling HLO text for a TPU target (spmd.plan.compile.recompile)
    "jax_compiler": PrivateSymbol("jax._src.compiler"),
    "xla_client": PrivateSymbol("jax._src.lib", "xla_client"),
}
"""The private jax symbols the product imports, by the name callers import them under."""


def _jax_release() -> str:
    try:
        return f"jax {importlib.metadata.version('jax')}"
    except importlib.metadata.PackageNotFoundError:
        return "this environment (no jax)"


__getattr__ = resolver(__name__, PRIVATE_SYMBOLS, _jax_release())

# ATen names torchax 0.0.13 resolves while it loads that torch 2.14 removed (named-tensor
# overloads; cholesky and qr, whose linalg_ forms remain). Found by reading torchax's sources
# for ``torch.ops.aten.<name>[.<overload>]`` and asking torch 2.15.0 for each.
TORCHAX_REMOVED_OVERLOADS: dict[str, tuple[str, ...]] = {
    "all": ("dimname", "dimname_out"),
    "index_add": ("dimname",),
    "index_copy": ("dimname",),
    "index_copy_": ("dimname",),
    "index_fill": ("Dimname_Scalar", "Dimname_Tensor"),
    "index_fill_": ("Dimname_Scalar", "Dimname_Tensor"),
    "norm": ("names_ScalarOpt_dim", "names_ScalarOpt_dim_dtype", "names_dtype_out", "names_out"),
    "prod": ("dim_Dimname",),
    "std": ("correction_names", "correction_names_out", "names_dim", "names_out"),
    "std_mean": ("correction_names", "names_dim"),
    "unbind": ("Dimname",),
}
TORCHAX_REMOVED_OPERATORS: tuple[str, ...] = ("cholesky", "qr")

# The first libtpu measured to compile for tpu7x here (0.0.20 refuses it; 0.0.42.1 and 0.0.52 compile).
LIBTPU_FOR_TPU7X = "0.0.42"
_CURRENT_LANE = 'pip install -e ".[dev-current]" (or "xla-spmd[current,plan]")'


class _StandIn:
    """Answers for one removed ATen name while torchax loads; raises if anything calls it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, key: str) -> _StandIn:
        if key.startswith("__"):
            raise AttributeError(key)
        return _StandIn(f"{self._name}.{key}")  # e.g. aten.cholesky.default

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StandInReachedError(
            f"The model reached aten.{self._name}, which torch {torch.__version__} removed and torchax still names; "
            "the planner gave it a stand-in only so that torchax could load. Avoid the op (named-tensor dims, "
            "torch.cholesky / torch.qr: use the torch.linalg forms), or plan on the torch_xla lane (torch 2.9)."
        )

    def __repr__(self) -> str:
        return f"<stand-in for aten.{self._name}>"


def missing_aten_names() -> list[str]:
    """The names of `TORCHAX_REMOVED_OVERLOADS` / `TORCHAX_REMOVED_OPERATORS` this torch lacks."""
    aten = torch.ops.aten
    missing = [name for name in TORCHAX_REMOVED_OPERATORS if not hasattr(aten, name)]
    for name, overloads in TORCHAX_REMOVED_OVERLOADS.items():
        packet = getattr(aten, name, None)
        missing += [f"{name}.{o}" for o in overloads if packet is None or not hasattr(packet, o)]
    return missing


@contextlib.contextmanager
def aten_stand_ins() -> Iterator[list[str]]:
    """Inside: every name of `missing_aten_names` resolves to a `_StandIn`. Yields the names given."""
    aten = torch.ops.aten
    names = missing_aten_names()
    given: list[tuple[Any, str]] = []
    try:
        for name in names:
            packet_name, _, overload = name.partition(".")
            owner = getattr(aten, packet_name) if overload else aten
            setattr(owner, overload or packet_name, _StandIn(name))
            given.append((owner, overload or packet_name))
        yield names
    finally:
        for owner, key in reversed(given):
            delattr(owner, key)


def import_torchax() -> Any:
    """``torchax``, imported and its op tables loaded (its default ``Environment``), on this torch.

    Later ``Environment`` objects reuse the loaded tables, so they need no stand-ins.
    """
    if "torchax" in sys.modules:
        return sys.modules["torchax"]
    drop_stale_submodules()
    # held: torchax 0.0.13 on torch 2.9 logs "Duplicate op registration" warnings as it loads
    with held_stderr(), _flax_placeholder(), aten_stand_ins(), _no_accelerator_claim():
        import torchax

        torchax.default_env()
    return torchax


def override_function(env: Any, function: Any, impl: Any) -> None:
    """Make torchax's ``env`` run ``impl`` (torch tensors in and out) for the torch function
    ``function``. ``Environment.override_op_definition`` does this, but the 0.0.13 build that
    venv-xla has (the same version number as PyPI's) constructs its ``Operator`` without the
    ``is_view_op`` field it requires; so the ``Operator`` is built here, from its own fields."""
    import dataclasses

    from torchax.ops import ops_registry

    flags = {"is_jax_function": False, "is_user_defined": True, "needs_env": False, "is_view_op": False}
    fields = {f.name for f in dataclasses.fields(ops_registry.Operator)}
    env._ops[function] = ops_registry.Operator(function, impl, **{k: v for k, v in flags.items() if k in fields})


def scan_stacked_outputs(eqn: Any) -> list[Any]:
    """The stacked outputs (``ys``) of a jaxpr ``scan`` equation, after its carries."""
    if "num_carry" in eqn.params:  # jax <= 0.10
        return list(eqn.outvars[eqn.params["num_carry"] :])
    carries, _ = eqn.params["ft_out"].unpack()  # jax 0.12: (carries, ys)
    return list(eqn.outvars[len(carries) :])


# libtpu releases that read an older Mosaic IR (Pallas kernels) than the jax they come with
# emits: jax 0.7.1 writes version 8, its libtpu 0.0.20 reads <= 7 ("Unsupported version:
# expected <= 7 but got 8").
_MOSAIC_IR_CAP = {"0.0.20": 7}


@contextlib.contextmanager
def mosaic_ir_for_libtpu() -> Iterator[None]:
    """Inside: Pallas kernels (splash attention) lower to the Mosaic IR version the installed
    libtpu reads. jax asks the TPU for its version when one is attached; a compile-only client has
    none, so jax writes its newest. The cap is what jax itself uses for an older Cloud TPU."""
    cap = _MOSAIC_IR_CAP.get(_version("libtpu"))
    if cap is None:
        yield
        return
    tpu_custom_call = __getattr__("tpu_custom_call")
    newest = tpu_custom_call.get_ir_version
    tpu_custom_call.get_ir_version = lambda ctx: min(cap, newest(ctx) or cap)
    try:
        yield
    finally:
        tpu_custom_call.get_ir_version = newest


@dataclass(frozen=True)
class Toolchain:
    """What compiled a plan: the partitioner (``Shardy`` or ``GSPMD``), the package versions, and
    how the mesh's devices were ordered (`device_order`; empty when no devices were given)."""

    partitioner: str
    jax: str
    jaxlib: str
    libtpu: str
    torch: str
    torchax: str
    device_order: str = ""

    def describe(self) -> str:
        order = f"; mesh device order: {self.device_order}" if self.device_order else ""
        return f"{self.partitioner}; jax {self.jax}, libtpu {self.libtpu}, torch {self.torch}, torchax {self.torchax}{order}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def toolchain(devices: Sequence[Any] = ()) -> Toolchain:
    """The partitioner jax lowers with now (torch_xla 2.9 turns Shardy off when it imports jax),
    the installed versions, and the device order jax gives ``devices`` (a mesh's, if any)."""
    import jax

    shardy = bool(getattr(jax.config, "jax_use_shardy_partitioner", False))
    return Toolchain(
        "Shardy" if shardy else "GSPMD",
        _version("jax"),
        _version("jaxlib"),
        _version("libtpu"),
        torch.__version__.split("+")[0],
        _version("torchax"),
        device_order(devices) if devices else "",
    )


# Device kinds whose two TensorCores are two JAX devices on one chip, the core axis of jax's
# physical mesh (x, y, z, core) that jax 0.12 ranks first.
_CORE_AXIS_KINDS = ("TPU7x", "TPU7")


@dataclass(frozen=True)
class _MockTpu:
    """A TPU device as jax's ``mesh_utils`` reads one."""

    id: int
    coords: tuple[int, int, int]
    core_on_chip: int
    device_kind: str = "TPU7x"
    platform: str = "tpu"


@functools.cache
def core_axis_first() -> bool:
    """Whether the installed jax gives TPU7x's core axis to the busiest mesh axis first.

    Asked of jax itself, on mock devices: a 2x4x4 chip grid of two cores each (64 devices, past
    the small-slice ring rule) and a (32, 2) mesh, the case of jax PR 39340. The 2-device axis
    goes to each chip's two cores (jax 0.12) or to chips along x (jax 0.10.2, and 0.7.1 on the
    torch_xla lane, whose libtpu knows no TPU7x); a jax that cannot lay TPU7x out answers no."""
    from jax.experimental import mesh_utils

    chips = [(x, y, z) for z in range(4) for y in range(4) for x in range(2)]
    devices = [_MockTpu(2 * k + core, chip, core) for k, chip in enumerate(chips) for core in (0, 1)]
    try:
        mesh = mesh_utils.create_device_mesh((32, 2), devices, allow_split_physical_axes=True)
    except (AssertionError, ValueError, NotImplementedError):
        return False
    return all(a.coords == b.coords for a, b in mesh)


def device_order(devices: Sequence[Any]) -> str:
    """How `device_mesh` orders ``devices`` for a mesh, as a report says it: ``jax 0.12.0.1
    mesh_utils (core axis first)`` on TPU7x, ``jax 0.10.2 mesh_utils (core axis like x, y, z)``,
    ``jax 0.12.0.1 mesh_utils`` on chips of one device each."""
    order = f"jax {_version('jax')} mesh_utils"
    if getattr(devices[0], "device_kind", None) in _CORE_AXIS_KINDS:
        order += " (core axis first)" if core_axis_first() else " (core axis like x, y, z)"
    return order


def device_mesh(sizes: Sequence[int], devices: Sequence[Any], dcn_sizes: Sequence[int] | None = None) -> Any:
    """``devices`` as an array of shape ``sizes``, in the order the installed jax gives them for a
    mesh (its ICI-aware ``create_device_mesh``; ``create_hybrid_device_mesh`` across slices, where
    ``sizes`` are per slice and ``dcn_sizes`` across them). Physical axes may be split."""
    from jax.experimental import mesh_utils

    if dcn_sizes is not None:
        return mesh_utils.create_hybrid_device_mesh(sizes, dcn_sizes, devices, allow_split_physical_axes=True)
    return mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)


def topology_devices(libtpu_topology: str, slices: int, chip_family: str) -> list[Any]:
    """The devices of ``libtpu_topology`` (``v5p:4x4x4``) from libtpu's compile-only client.

    libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) when it loads, which would make a
    second planner (a test, an advisor worker) fail while one runs; the planner never touches a
    TPU, so it lets several load (``ALLOW_MULTIPLE_LIBTPU_LOAD``, unless set otherwise). What libtpu
    writes to stderr while it starts (its TPU-host probing, which fails on a CPU host and is harmless
    here) is held and shown only when the call fails.

    Raises:
        CompilerVersionError: libtpu does not know the chip (``tpu7x`` before 0.0.42).
        TopologyError: libtpu refuses the shape.
    """
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    kwargs = {"num_slices": slices} if slices > 1 else {}
    try:
        with held_stderr():  # libtpu's start-up on a host with no TPU (spmd._util.held_stderr)
            return list(topologies.get_topology_desc(platform="tpu", topology_name=libtpu_topology, **kwargs).devices)
    except Exception as e:  # jaxlib's XlaRuntimeError: libtpu's refusal, which is the user's input
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "Invalid TPU external name" in message:
            raise CompilerVersionError(
                f"libtpu {_version('libtpu')} (jax {_version('jax')}) does not compile for {chip_family} "
                f"({libtpu_topology!r}): {message}. {chip_family} needs libtpu >= {LIBTPU_FOR_TPU7X} with jax 0.10.2 or newer, "
                f"the current lane: {_CURRENT_LANE}. The torch_xla lane stays on jax 0.7.1 / libtpu 0.0.20, "
                "which torch_xla 2.9 was released with."
            ) from None
        raise TopologyError(f"libtpu refuses the topology {libtpu_topology!r}: {message}") from None


def compile_with_hlo(lowered: Any, options: Mapping[str, Any] | None = None) -> tuple[Any, str, str]:
    """``(compiled, optimized HLO text, memory-usage report)``: compile ``lowered`` with
    ``options`` (libtpu's, by name) and XLA's dump of the optimized module, and read it (module
    docstring). The report (libtpu's buffer list, largest last) is empty when the compiler writes
    none. Compile errors propagate as jax raises them."""
    with tempfile.TemporaryDirectory(prefix="xla-spmd-plan-hlo-") as dump:
        options = {**(options or {}), "xla_dump_to": dump, "xla_dump_hlo_as_text": True}
        compiled = lowered.compile(compiler_options=options)
        found = sorted(Path(dump).glob("*after_optimizations.txt"), key=lambda p: p.stat().st_size)
        if not found:
            raise RuntimeError(f"XLA wrote no optimized HLO to {dump}: the dump flags were not honoured.")
        reports = sorted(
            Path(dump).glob("*after_optimizations-memory-usage-report.txt"), key=lambda p: p.stat().st_size
        )
        return compiled, found[-1].read_text(), reports[-1].read_text() if reports else ""
