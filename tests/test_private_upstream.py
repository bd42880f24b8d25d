"""Private symbols of torch and jax have one home each (issue 35): `spmd._util.torch_compat` for
torch, `spmd.plan._jax_compat` for jax. Every symbol in a home's table resolves on this lane (the
test names it when an upgrade moves it), and no other module imports a private symbol of torch,
jax, torch_xla, transformers or torchax."""

import ast
import importlib.util
from pathlib import Path

import pytest

from spmd._util import private_symbols, torch_compat
from spmd._util.private_symbols import PrivateSymbol, PrivateSymbolError

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("mesh", "spmd", "fsdp_xla", "examples", "benchmarks")
UPSTREAMS = ("torch", "jax", "jaxlib", "torch_xla", "transformers", "torchax", "accelerate")
HOMES = {"spmd/_util/torch_compat.py", "spmd/plan/_jax_compat.py"}


def _jax_table() -> dict[str, PrivateSymbol]:
    if importlib.util.find_spec("jax") is None:
        return {}
    from spmd.plan import _jax_compat

    return _jax_compat.PRIVATE_SYMBOLS


def _resolve(home, name: str) -> None:
    try:
        getattr(home, name)
    except PrivateSymbolError as e:
        pytest.fail(str(e))


@pytest.mark.parametrize("name", sorted(torch_compat.PRIVATE_SYMBOLS))
def test_private_torch_symbol_resolves(name):
    _resolve(torch_compat, name)


@pytest.mark.parametrize("name", sorted(_jax_table()))
def test_private_jax_symbol_resolves(name):
    from spmd.plan import _jax_compat

    _resolve(_jax_compat, name)


def test_a_moved_symbol_fails_naming_it_and_its_new_home_to_fix():
    table = {"Gone": PrivateSymbol("torch.utils._pytree", "no_such_function")}
    lookup = private_symbols.resolver("spmd._util.torch_compat", table, "torch 9.9")
    with pytest.raises(PrivateSymbolError, match=r"torch 9\.9 has no torch\.utils\._pytree\.no_such_function"):
        lookup("Gone")
    with pytest.raises(AttributeError, match="has no attribute 'Other'"):
        lookup("Other")


def test_symbols_load_what_they_name():
    from torch.distributed.tensor import placement_types

    assert torch_compat.StridedShard is placement_types._StridedShard  # noqa: SLF001
    assert torch_compat.composable_state.__name__ == "torch.distributed._composable_state"


def _private(parts: list[str]) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts)


def private_upstream_imports(source: str) -> list[str]:
    """``line path`` of every import of a private upstream symbol in ``source``: a private module
    on the path, a private name imported from an upstream module, or ``importlib.import_module``
    of such a path."""
    found = []
    for node in ast.walk(ast.parse(source)):
        paths: list[str] = []
        if isinstance(node, ast.Import):
            paths = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            paths = [f"{node.module}.{a.name}" for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            paths = [node.args[0].value]
        for path in paths:
            parts = path.split(".")
            if parts[0] in UPSTREAMS and _private(parts):
                found.append(f"{node.lineno} {path}")
    return found


def _upstream_aliases(tree: ast.AST) -> set[str]:
    """Local names bound to an upstream module by ``import`` (``import torch``, ``import
    torch.distributed as dist``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in UPSTREAMS:
                    names.add(a.asname or a.name.split(".")[0])
    return names


def private_upstream_attributes(source: str) -> list[str]:
    """``line path`` of every read of a private attribute through an upstream module
    (``torch._C._disabled_torch_function_impl``, ``dist.distributed_c10d._get_default_store``);
    operator names (``torch.ops.aten._local_scalar_dense``) are ATen's, not Python's, and pass."""
    tree = ast.parse(source)
    aliases = _upstream_aliases(tree)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        parts, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            parts.insert(0, base.attr)
            base = base.value
        if not (isinstance(base, ast.Name) and base.id in aliases) or "ops" in parts:
            continue
        cut = next((i for i, p in enumerate(parts) if _private([p])), None)
        if cut is not None:
            found.add((node.lineno, ".".join([base.id, *parts[: cut + 1]])))
    return [f"{line} {path}" for line, path in sorted(found)]


def test_the_scan_sees_private_attributes_of_upstream_modules():
    source = (
        "import torch\nimport torch.distributed as dist\nx = torch._C._disabled_torch_function_impl\n"
        "store = dist.distributed_c10d._get_default_store()\nop = torch.ops.aten._local_scalar_dense\n"
        "t = torch.Tensor._make_wrapper_subclass\nok = torch.nn.Linear\nself = object()\ny = self._x\n"
    )
    assert private_upstream_attributes(source) == [
        "3 torch._C",
        "4 dist.distributed_c10d._get_default_store",
        "6 torch.Tensor._make_wrapper_subclass",
    ]


def test_only_the_compat_homes_read_private_attributes_of_upstream_modules():
    found = []
    for directory in ("mesh", "spmd", "fsdp_xla"):
        for path in sorted((ROOT / directory).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in HOMES:
                found += [f"{rel}:{hit}" for hit in private_upstream_attributes(path.read_text())]
    assert found == [], "read these through spmd._util.torch_compat / spmd.plan._jax_compat (add them to its table)"


def test_the_scan_sees_each_kind_of_private_import():
    source = (
        "import torch._dynamo\nfrom torch.utils._pytree import tree_map\nfrom torch.distributed import _composable_state\n"
        "import importlib\nimportlib.import_module('jax._src.compiler')\nfrom torch.distributed.tensor import Shard\n"
        "from spmd._util.torch_compat import tree_map\n"
    )
    assert [f.split()[1] for f in private_upstream_imports(source)] == [
        "torch._dynamo",
        "torch.utils._pytree.tree_map",
        "torch.distributed._composable_state",
        "jax._src.compiler",
    ]


def test_only_the_compat_homes_import_private_upstream_symbols():
    found = []
    for directory in SCANNED:
        for path in sorted((ROOT / directory).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in HOMES:
                found += [f"{rel}:{hit}" for hit in private_upstream_imports(path.read_text())]
    assert found == [], "import these from spmd._util.torch_compat / spmd.plan._jax_compat (add them to its table)"
