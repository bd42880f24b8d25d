"""Run pytorch/xla's own SPMD API tests against our names and print passed/failed.

Takes pytorch/xla's ``test/spmd/test_xla_sharding.py`` and its other SPMD API suites (the DTensor
ones included; and the base module) at a tag from a
checkout you give, changes only the imports of ``torch_xla.distributed.spmd`` to ``spmd`` (so
every ``xs.*`` name, ``XLAShardedTensor`` and ``xla_sharding.MarkShardingFunction`` are ours),
and runs the file with pytest on 8 virtual CPU devices: once as published (torch_xla) and once
with our imports. Nothing of pytorch/xla is copied into this project; the files are read from
the checkout into a temporary directory.

    python tests/compat/run_torch_xla_spmd_tests.py --xla-repo PATH [--ref v2.9.0] [--json out.json]
    python tests/compat/run_torch_xla_spmd_tests.py --xla-repo PATH --reference tests/data/torch_xla_spmd/v2.9.0.json

PATH is a pytorch/xla git checkout or bare git directory. The exit code is 1 when a test that
passes on torch_xla fails with ours and is not one of the intended differences below (each
listed, with its reason, in docs/migration.md). ``--reference`` takes torch_xla's outcomes from
a file an earlier run wrote (``--json``) instead of running torch_xla again: the file in
tests/data holds what torch_xla 2.9.0 passed here, at the commit it names.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

# The suites run by default; each runs in its own process (some set environment variables at import).
SUITES = (
    "test/spmd/test_xla_sharding.py",
    "test/spmd/test_spmd_parameter_wrapping.py",
    "test/spmd/test_fsdp_v2.py",
    "test/spmd/test_mp_input_sharding.py",
    "test/spmd/test_xla_spmd_python_api_interaction.py",
    "test/spmd/test_dtensor_redistribute.py",
    "test/spmd/test_dtensor_convert_mesh.py",
    "test/spmd/test_xla_sharded_tensor.py",
    "test/spmd/test_xla_dtensor_spec_conversion.py",
    "test/spmd/test_xla_dtensor_placements.py",
)
HELPERS = ("test/spmd/test_xla_sharding_base.py", "test/spmd/args_parse.py")

# Tests that expect torch_xla's AssertionError for bad input; we raise a typed
# ValueError/TypeError subclass on purpose (asserts vanish under `python -O`). Keep in sync with
# docs/migration.md, which a test checks.
INTENDED_DIFFERENCES: dict[str, str] = {
    "test_invalid_axis_names_length": "MeshError (a ValueError) names the axis count to give",
    "test_duplicate_axis_names": "MeshError (a ValueError) shows the repeated name",
    "test_invalid_device_count": "MeshError (a ValueError) shows the shape and the id count",
    "test_duplicate_device_ids": "MeshError (a ValueError) lists the repeated ids",
    "test_device_ids_out_of_bounds": "a Mesh needs no runtime (plan a pod on a laptop): ids are checked "
    "against the runtime where the mesh is used, with DeviceCountError",
    "test_mismatch_global_devices": "a Mesh needs no runtime: a mesh over fewer devices than the runtime "
    "raises DeviceCountError where it is used (mark_sharding), not when built",
}

_SPMD_IMPORT = re.compile(r"^(\s*(?:import|from)\s+)torch_xla\.distributed\.spmd\b", re.MULTILINE)


def ours(source: str) -> str:
    """``source`` with every import of ``torch_xla.distributed.spmd`` (and its submodules)
    turned into the same import from ``spmd``; nothing else changes."""
    return _SPMD_IMPORT.sub(r"\1spmd", source)


def _read(repo: Path, ref: str, path: str) -> str:
    if (repo / path).is_file() and not ref:
        return (repo / path).read_text()
    return subprocess.run(
        ["git", f"--git-dir={_git_dir(repo)}", "show", f"{ref or 'HEAD'}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _git_dir(repo: Path) -> Path:
    return repo / ".git" if (repo / ".git").exists() else repo


def run(files: dict[str, str], suites: list[str], workdir: Path, label: str) -> dict[str, str]:
    """Write ``files`` into ``workdir`` and run each of ``suites`` with pytest; ``{test id: outcome}``."""
    workdir.mkdir(parents=True)
    for name, text in files.items():
        (workdir / name).write_text(text)
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="8")
    env.pop("XLA_FLAGS", None)
    env.pop("XLA_USE_SPMD", None)
    project_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir), project_root, env.get("PYTHONPATH")]))
    outcomes: dict[str, str] = {}
    for suite in suites:
        junit = workdir / f"{suite}.junit.xml"
        print(f"[{label}] {suite} ...", flush=True)
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", suite],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
        )
        if not junit.exists():
            print(f"[{label}] {suite} did not run:\n{(run.stdout + run.stderr)[-2000:]}", file=sys.stderr)
            outcomes[f"{suite}::<collection>"] = "failed"
            continue
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = f"{Path(suite).stem}::{case.get('classname', '').split('.')[-1]}.{case.get('name')}"
            if case.find("skipped") is not None:
                outcomes[name] = "skipped"
            elif case.find("failure") is not None or case.find("error") is not None:
                outcomes[name] = "failed"
            else:
                outcomes[name] = "passed"
    return outcomes


def reference_outcomes(path: Path, ref: str, suites: list[str]) -> dict[str, str]:
    """torch_xla's outcomes for ``suites`` from a file ``--json`` wrote (``results.torch_xla``).

    Raises:
        SystemExit: the file is not such a record, is of another ref, or lacks one of ``suites``.
    """
    try:
        data = json.loads(path.read_text())
        recorded = data["results"]["torch_xla"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--reference {path}: not a record written by --json ({type(e).__name__}: {e}).") from None
    if data.get("ref") != ref:
        raise SystemExit(f"--reference {path} holds ref {data.get('ref')!r}, the tests run are {ref!r}; pass --ref.")
    stems = {Path(s).stem for s in suites}
    absent = sorted(stems - {name.split("::")[0] for name in recorded})
    if absent:
        raise SystemExit(f"--reference {path} has no torch_xla outcomes for {absent}; run without --reference.")
    return {n: o for n, o in recorded.items() if n.split("::")[0] in stems}


def _count(outcomes: dict[str, str]) -> str:
    counts = {k: list(outcomes.values()).count(k) for k in ("passed", "failed", "skipped")}
    return ", ".join(f"{v} {k}" for k, v in counts.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--xla-repo", type=Path, required=True, help="pytorch/xla checkout or git directory")
    parser.add_argument("--ref", default="v2.9.0", help="git ref of the tests (default v2.9.0; '' = work tree)")
    parser.add_argument("--json", type=Path, help="write every test's outcome here")
    parser.add_argument("--only-ours", action="store_true", help="skip the torch_xla run")
    parser.add_argument("--reference", type=Path, help="torch_xla's outcomes from an earlier --json (skips its run)")
    parser.add_argument(
        "--suite", action="append", help=f"a test file to run (repeatable; default: {', '.join(SUITES)})"
    )
    args = parser.parse_args(argv)

    paths = list(args.suite or SUITES)
    sources = {Path(p).name: _read(args.xla_repo, args.ref, p) for p in [*paths, *HELPERS]}
    suites = [Path(p).name for p in paths]
    with tempfile.TemporaryDirectory(prefix="torch_xla_compat_") as tmp:
        results = {}
        if args.reference:
            results["torch_xla"] = reference_outcomes(args.reference, args.ref, suites)
        elif not args.only_ours:
            results["torch_xla"] = run(sources, suites, Path(tmp) / "torch_xla", "torch_xla")
        results["ours"] = run({n: ours(s) for n, s in sources.items()}, suites, Path(tmp) / "ours", "ours")

    for suite in suites:
        stem = Path(suite).stem
        row = "  ".join(
            f"{label}: {_count({n: o for n, o in outcomes.items() if n.startswith(stem + '::')})}"
            for label, outcomes in results.items()
        )
        print(f"{stem:<44} {row}")
    for label, outcomes in results.items():
        print(f"{'all suites':<44} {label}: {_count(outcomes)}")
    reference = results.get("torch_xla", {})
    regressions = sorted(n for n, o in reference.items() if o == "passed" and results["ours"].get(n) != "passed")
    intended = [n for n in regressions if n.rsplit(".", 1)[-1] in INTENDED_DIFFERENCES]
    unexpected = [n for n in regressions if n not in intended]
    for n in intended:
        print(f"  intended difference: {n}: {INTENDED_DIFFERENCES[n.rsplit('.', 1)[-1]]}")
    for n in unexpected:
        print(f"  FAILS WITH OURS: {n}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"ref": args.ref, "results": results, "unexpected": unexpected}, indent=1))
    print(
        f"passed on torch_xla and with ours: {sum(1 for n, o in reference.items() if o == 'passed' and results['ours'].get(n) == 'passed')}; "
        f"intended differences: {len(intended)}; unexpected failures: {len(unexpected)}"
    )
    if reference and not any(o == "passed" for o in reference.values()):
        print("the torch_xla run passed nothing: the comparison is void (see the errors above)", file=sys.stderr)
        return 2
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
