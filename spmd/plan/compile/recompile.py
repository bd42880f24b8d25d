"""Compile a graph that torch_xla compiled here again, with libtpu's compiler, for a TPU slice.

XLA's CPU compiler runs none of the collective passes of the TPU and GPU compilers: it keeps
GSPMD's gradient reduction as an all-reduce followed by a slice (a TPU compile fuses them into a
reduce-scatter, half the bytes), and it neither combines nor reassociates collectives. So bytes
sent measured on virtual CPU devices overstate what the same program sends on a TPU. This compiles
the very graph a run dumped, before XLA's passes (``*.before_optimizations.txt``: the
unpartitioned module with GSPMD's sharding annotations), for a TPU slice of as many chips, and
reads its collectives with `spmd.plan.compile.program.step_collectives`. No TPU is needed.

    collectives = tpu_step_collectives(Path(graph.hlo_path), devices=8)   # a v5e-8

The compile runs in a subprocess (``python -m spmd.plan.compile.recompile``): the calling process's
XLA_FLAGS (virtual CPU devices, dumps) would apply to it, and torch_xla's runtime and libtpu's
stay apart. Needs ``jax`` with ``libtpu`` (the ``plan`` extra).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from spmd.errors import ShardingError
from spmd.plan.compile.program import StepCollective, step_collectives
from spmd.plan.request.topology import TpuSlice, parse_slice

__all__ = ["RecompileError", "before_optimizations_path", "compile_hlo_for_tpu", "tpu_step_collectives"]

_BEFORE = ".before_optimizations.txt"
_AFTER_SUFFIXES = (".cpu_after_optimizations.txt", ".tpu_after_optimizations.txt", ".after_optimizations.txt")


class RecompileError(ShardingError, RuntimeError):
    """The graph cannot be compiled for a TPU slice: not an optimized dump, no unoptimized dump
    beside it, no v5e slice of that many chips, or libtpu failed (no libtpu, a compiler error)."""


def before_optimizations_path(after_path: Path) -> Path:
    """The unoptimized dump beside an optimized one (``module_0003.G.cpu_after_optimizations.txt``
    -> ``module_0003.G.before_optimizations.txt``).

    Raises:
        RecompileError: the name is not an optimized dump's, or the file is missing (XLA writes
            it with ``--xla_dump_hlo_as_text``, as `spmd.inspector.prepare` asks).
    """
    name = after_path.name
    suffix = next((s for s in _AFTER_SUFFIXES if name.endswith(s)), None)
    if suffix is None:
        raise RecompileError(f"{after_path} is not an optimized HLO dump (*{_AFTER_SUFFIXES[0]}).")
    before = after_path.with_name(name[: -len(suffix)] + _BEFORE)
    if not before.exists():
        raise RecompileError(f"No unoptimized dump {before.name} beside {name}: dump with --xla_dump_hlo_as_text.")
    return before


def compile_hlo_for_tpu(hlo_text: str, target: TpuSlice) -> str:
    """The optimized, partitioned HLO text of ``hlo_text`` compiled by libtpu for ``target``
    (one partition per chip). Runs in this process: call it where XLA_FLAGS are clean."""
    import numpy as np

    from spmd.plan._jax_compat import jax_compiler as compiler
    from spmd.plan._jax_compat import xla_client as xc
    from spmd.plan.request.meshes import tpu_devices

    devices = tpu_devices(target)
    module = xc._xla.hlo_module_from_text(hlo_text)
    computation = xc.XlaComputation(module.as_serialized_hlo_module_proto())
    mlir = xc._xla.mlir.xla_computation_to_mlir_module(computation)
    client = devices[0].client
    options = compiler.get_compile_options(
        num_replicas=1,
        num_partitions=len(devices),
        device_assignment=np.array(devices).reshape(1, len(devices)),
        use_spmd_partitioning=True,
        backend=client,
    )
    # The module's own config (torch_xla lets GSPMD choose output layouts); lost in the conversion.
    header = hlo_text.split("\n", 1)[0]
    build = options.executable_build_options
    for which in ("output", "parameters"):
        if f"allow_spmd_sharding_propagation_to_{which}={{true}}" in header:
            setattr(build, f"allow_spmd_sharding_propagation_to_{which}", [True])
    blob = mlir.encode() if isinstance(mlir, str) else mlir
    executable = client.compile(blob, xc.DeviceList(tuple(devices)), options)
    return str(executable.hlo_modules()[0].to_string())


def _clean_env() -> dict[str, str]:
    """This process's environment without what configures torch_xla's or XLA's CPU runtime."""
    drop = ("XLA_FLAGS", "PJRT_DEVICE", "CPU_NUM_DEVICES", "XLA_HLO_DEBUG", "XLA_IR_DEBUG", "JAX_PLATFORMS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return env


def tpu_step_collectives(after_path: Path, devices: int, timeout: float = 900) -> list[StepCollective]:
    """The collectives of the graph whose optimized dump is ``after_path``, compiled by libtpu
    for a v5e slice of ``devices`` chips (in a subprocess).

    Raises:
        RecompileError: no unoptimized dump, no v5e slice of that many chips, or the compile
            failed or timed out (its error output is in the message).
    """
    before = before_optimizations_path(after_path)
    try:
        parse_slice(f"v5e-{devices}")
    except ValueError as e:
        raise RecompileError(f"No TPU v5e slice of {devices} chips to compile for: {e}") from None
    with tempfile.TemporaryDirectory(prefix="spmd-recompile-") as tmp:
        out = Path(tmp) / "tpu_after_optimizations.txt"
        command = [
            sys.executable,
            "-m",
            "spmd.plan.compile.recompile",
            str(before),
            str(out),
            "--slice",
            f"v5e-{devices}",
        ]
        try:
            done = subprocess.run(command, env=_clean_env(), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RecompileError(
                f"libtpu did not compile {before.name} for v5e-{devices} in {timeout:.0f} s."
            ) from None
        if done.returncode != 0 or not out.exists():
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise RecompileError(f"libtpu could not compile {before.name} for v5e-{devices}:\n{tail}")
        return step_collectives(out.read_text())


def main(argv: list[str] | None = None) -> None:
    """``python -m spmd.plan.compile.recompile BEFORE.txt OUT.txt --slice v5e-8``."""
    parser = argparse.ArgumentParser(description="Compile an unoptimized HLO dump for a TPU slice with libtpu.")
    parser.add_argument("hlo", type=Path, help="an unoptimized HLO text dump (*.before_optimizations.txt)")
    parser.add_argument("out", type=Path, help="where to write the TPU-optimized HLO text")
    parser.add_argument("--slice", default="v5e-8", help="the TPU slice (one partition per chip)")
    args = parser.parse_args(argv)
    args.out.write_text(compile_hlo_for_tpu(args.hlo.read_text(), parse_slice(args.slice)))


if __name__ == "__main__":
    main()
