"""Old module paths of ``spmd`` that moved into subpackages: one table, one import hook.

``import spmd.partition_spec`` (and ``from spmd.partition_spec import PartitionSpec``) still
works: the hook hands back the module at its new path, under the old name too, after a
`DeprecationWarning` that names the path to import from. The tree shows only the new layout;
docs/migration.md lists the same table.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED_MODULES", "install"]

# old path -> (module now, what to import instead)
MOVED_MODULES: dict[str, tuple[str, str]] = {
    "spmd.partition_spec": ("spmd.sharding._partition_spec", "spmd.sharding"),
    "spmd.named_sharding": ("spmd.sharding._named_sharding", "spmd.sharding"),
    "spmd.hlo_sharding": ("spmd.sharding._hlo_sharding", "spmd.sharding"),
    "spmd.placements": ("spmd.sharding._placements", "spmd.sharding"),
    "spmd.sharding_plan": ("spmd.logical_axes", "spmd.logical_axes"),
    "spmd.sharding_type": ("spmd.sharding._sharding_type", "spmd.compat (ShardingType)"),
    "spmd.process_data": ("spmd.multiprocess._process_data", "spmd.multiprocess"),
    "spmd.process_layout": ("spmd.multiprocess._process_layout", "spmd.multiprocess"),
    "spmd.process_group": ("spmd.multiprocess._process_group", "spmd.multiprocess"),
    "spmd.data_loader": ("spmd.multiprocess._data_loader", "spmd.multiprocess"),
    "spmd.hang_report": ("spmd.multiprocess._hang_report", "spmd.multiprocess"),
    "spmd.atomic_file": ("spmd._util.atomic_file", "spmd.files"),
    "spmd.regular_file": ("spmd._util.regular_file", "spmd.files"),
    "spmd.cli_args": ("spmd._util.cli_args", "spmd._util.cli_args (private)"),
    "spmd._torch_compat": ("spmd._util.torch_compat", "spmd.torch_compat"),
    # The three compat modules are named for what they answer (torch_xla's names stay spmd.compat).
    "spmd.plan._compat": ("spmd.plan._jax_compat", "spmd.plan._jax_compat (private)"),
    "spmd.plan.report_text": ("spmd.plan.report", "spmd.plan.report"),
    "spmd.plan.advice_text": ("spmd.plan.advisor.advice", "spmd.plan.advisor.advice"),
    # The planner by stage (docs/architecture.md): request -> lower -> compile -> predict -> report
    # -> advisor. spmd.plan.compile, .report and .advisor became their stage's package, with the
    # same names; the other modules moved into their stage.
    **{
        f"spmd.plan.{leaf}": (f"spmd.plan.{stage}.{leaf}", f"spmd.plan.{stage}.{leaf}")
        for stage, leaves in (
            ("request", "attention context custom_remat dcn meshes models remat settings specs topology vocab_tiling"),
            ("lower", "lowering residuals"),
            ("compile", "program recompile"),
            ("predict", "ceiling estimate memory published"),
            ("report", "plot"),
            ("advisor", "advice compile_pool plan_cache search"),
        )
        for leaf in leaves.split()
    },
    **{
        f"spmd.plan.{leaf}": (f"spmd.plan.predict.{leaf}", f"spmd.plan.predict.{leaf} (private)")
        for leaf in ("_calibration", "_op_costs", "_step_time")
    },
    # The HLO text reader is the seam of the inspector, the planner and fsdp_xla: public on its own.
    "spmd.inspector.hlo_text": ("spmd.hlo", "spmd.hlo"),
    "spmd.inspector.hlo_shape": ("spmd.hlo", "spmd.hlo"),
    # The dry run's capture, grouped as the torch_xla lane's is (both private: the CLI runs them).
    **{
        f"spmd.inspector._dtensor_{name}": (f"spmd.inspector._dtensor.{name}", "spmd.inspector (private)")
        for name in ("cli", "collectives", "params", "placeholders", "record", "report", "run", "shards", "world")
    },
}


def warn_moved(old: str, stacklevel: int = 2) -> None:
    """The one deprecation message for a moved module path."""
    new, use = MOVED_MODULES[old]
    warnings.warn(
        f"{old} moved to {new}; import from {use} instead (docs/migration.md)",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the module at its new path (the same object, not a copy)."""

    def __init__(self, old: str) -> None:
        self.old = old
        self.own: tuple = (None, None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warn_moved(self.old, stacklevel=2)  # warnings skips importlib's frames: the importing line
        target = importlib.import_module(MOVED_MODULES[self.old][0])
        self.own = (target.__spec__, target.__loader__)
        return target

    def exec_module(self, module: ModuleType) -> None:
        # importlib set the old name's spec on the shared module object: give it back its own,
        # so `importlib.reload` and pickling by module path see the new path.
        module.__spec__, module.__loader__ = self.own


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname))


_FINDER = _MovedFinder()


def install() -> None:
    """Put the hook first on ``sys.meta_path`` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
