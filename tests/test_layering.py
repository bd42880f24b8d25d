"""The layering holds: mesh -> spec and sharding math -> backends -> API -> torch_xla compatibility
-> FSDP and tools (import-linter's layers contract in pyproject.toml), with no import cycle, and
torch_xla imported only by the torch_xla backend; the seams hold: no package imports another's
private modules, a subpackage's private modules are imported only inside it, and spmd.plan and
spmd.inspector are layered inside (import-linter's other contracts)."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mesh", "spmd", "fsdp_xla")


def _contracts() -> list[dict]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_every_import_contract_is_kept():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    run = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    kept = f"{len(_contracts())} kept, 0 broken"
    assert run.returncode == 0 and kept in run.stdout, run.stdout[-3000:]


def _owner(module: str) -> str | None:
    """The package a private module belongs to (``spmd.sharding`` for
    ``spmd.sharding._placements``), or None for a public module."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _matches(module: str, expression: str) -> bool:
    if expression.endswith(".*"):
        return module.startswith(expression[:-1])
    return module == expression or module.startswith(expression + ".")


def _seam_contract(name_start: str) -> list[str]:
    return next(c for c in _contracts() if c["name"].startswith(name_start))["forbidden_modules"]


def test_the_seam_contracts_name_every_private_module_and_no_public_one():
    graph = grimp.build_graph(*PACKAGES)
    across = _seam_contract("No package imports another package's private modules")
    inside = _seam_contract("A subpackage's private modules")
    wrong = []
    for module in sorted(graph.modules):
        owner = _owner(module)
        if any(_matches(module, e) for e in across) != (owner is not None):
            wrong.append(f"{module}: {'private' if owner else 'public'}, across packages")
        if any(_matches(module, e) for e in inside) != (owner is not None and "." in owner):
            wrong.append(f"{module}: {'private' if owner else 'public'}, inside a package")
    assert wrong == [], "fix the forbidden_modules lists in pyproject.toml"


def test_the_private_module_rule():
    assert _owner("spmd.sharding._placements") == "spmd.sharding"
    assert _owner("spmd._backend.dtensor_backend") == "spmd"
    assert _owner("spmd.__main__") is None and _owner("spmd.backend") is None
    assert _matches("spmd.sharding._placements", "spmd.sharding.*")
    assert not _matches("spmd.sharding", "spmd.sharding.*")
    assert _matches("spmd._backend.protocol", "spmd._backend")


def _strongly_connected(graph) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            found.append(component)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_among_our_modules():
    # Imports under ``if TYPE_CHECKING:`` never run (a text renderer naming the value it renders).
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    cycles = [sorted(c) for c in _strongly_connected(graph) if len(c) > 1]
    assert cycles == []


def test_mesh_imports_nothing_of_ours_above_it():
    graph = grimp.build_graph(*PACKAGES)
    upward = sorted(
        (m, imported)
        for m in graph.modules
        if m.split(".")[0] == "mesh"
        for imported in graph.find_modules_directly_imported_by(m)
        if imported.split(".")[0] != "mesh"
    )
    assert upward == []


def _imports_of(top: str, allowed: str) -> list[str]:
    """Import statements of ``top`` (or its modules) outside the files under ``allowed``."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(allowed):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                found += [f"{rel}:{node.lineno} {n}" for n in names if n.split(".")[0] == top]
    return found


def test_only_the_torch_xla_backend_imports_torch_xla():
    assert _imports_of("torch_xla", "spmd/_backend/torch_xla_backend/") == []


def test_only_one_module_imports_torchft():
    # torchft is an optional extra: fsdp_xla.ft._torchft imports it by name (importlib) and says
    # what to install when it is missing; a plain import elsewhere would be a raw ModuleNotFoundError.
    assert _imports_of("torchft", "fsdp_xla/ft/_torchft.py") == []


MAX_FUNCTION_LINES = 60
MAX_MODULE_CODE_LINES = 600  # one concept may take this much code before it splits (JAX's named_sharding.py: 610)


def _library_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def code_lines(source: str) -> int:
    """Lines of code: not blank, not a comment, not inside a docstring (docs never force a split)."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = source.splitlines()
    return sum(
        1
        for i, line in enumerate(lines, 1)
        if i not in docstrings and line.strip() and not line.strip().startswith("#")
    )


def test_code_lines_counts_code_only():
    source = (
        '"""Module doc.\n\nMore."""\n\n# why\nX = 1\n\n\ndef f():\n    """Doc."""\n    return """not a docstring"""\n'
    )
    assert code_lines(source) == 3  # X = 1, def f():, return ...


def test_no_module_over_600_lines_of_code():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _library_files()
        if (n := code_lines(p.read_text())) > MAX_MODULE_CODE_LINES
    }
    assert long == {}, f"split these by concept (at most {MAX_MODULE_CODE_LINES} lines of code): {long}"


def test_no_function_over_60_lines():
    long = {}
    for path in _library_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert long == {}, f"split these into named steps (at most {MAX_FUNCTION_LINES} lines): {long}"


def _layer_modules() -> set[str]:
    import tomllib

    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    return {m.strip() for layer in contract["layers"] for m in layer.split(":")}


def test_every_module_sits_in_the_layers_contract():
    layers = _layer_modules()
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
    }
    outside = sorted(
        m for m in modules - set(PACKAGES) if not any(m == layer or m.startswith(layer + ".") for layer in layers)
    )
    assert not outside, f"not in any layer of pyproject.toml's contract: {outside}"
