"""Every name in each package's __all__ exists, is public, and has a docstring where callable."""

import importlib

import pytest


@pytest.mark.parametrize(
    "package",
    [
        "mesh",
        "spmd",
        "fsdp_xla",
        "spmd.sharding",
        "spmd.multiprocess",
        "spmd.errors",
        "spmd.compat",
        "spmd.inspector",
        "fsdp_xla.hf",
        "fsdp_xla.ft",
        "fsdp_xla.communication",
        "spmd.mfu",
        "spmd.logical_axes",
        "spmd.plan",
        "spmd.plan.advisor",
        "spmd.plan.compile.recompile",
        # the public seams between packages (docs/architecture.md)
        "mesh.checks",
        "spmd.backend",
        "spmd.files",
        "spmd.torch_compat",
        "fsdp_xla.checkpoint",
    ],
)
def test_all_names_exist(package):
    module = importlib.import_module(package)
    assert len(module.__all__) == len(set(module.__all__))
    for name in module.__all__:
        assert not name.startswith("_")
        obj = getattr(module, name)
        if callable(obj) and getattr(obj, "__module__", "").split(".")[0] in ("mesh", "spmd", "fsdp_xla"):
            assert obj.__doc__, f"{package}.{name} has no docstring"


def test_importing_spmd_does_not_start_a_runtime():
    import subprocess
    import sys

    code = "import spmd, mesh, sys; print('torch_xla' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_seams_re_export_their_homes():
    import mesh._checks
    import spmd
    import spmd._backend
    import spmd._util.torch_compat
    from mesh import checks
    from spmd import backend, torch_compat

    assert backend.backend_for is spmd.backend_for and backend.use_backend is spmd.use_backend
    assert backend.torch_xla_backend is spmd._backend.torch_xla_backend
    assert checks.require_int is mesh._checks.require_int
    assert torch_compat.redistribute is spmd._util.torch_compat.redistribute
    assert torch_compat.tree_flatten is spmd._util.torch_compat.tree_flatten  # a private symbol, loaded on use
