"""What users import keeps working after the layout change (issue 27): every name in a package's
``__all__`` at main's bd70236, every module path the README, docs, examples and benchmarks import,
every name torch_xla 2.9's ``torch_xla.distributed.spmd`` exports; and the facade stays small."""

import ast
import importlib
import json
import re
import sys
import warnings
from pathlib import Path

import pytest

import spmd
from spmd import _moved

ROOT = Path(__file__).resolve().parents[1]

# Each public module's ``__all__`` at bd70236 (read with ``git show bd70236:<path>``; torch_xla's
# own objects, listed there only where torch_xla is installed, left out).
ALL_AT_BD70236 = {
    "fsdp_xla": [
        "CheckpointError",
        "CheckpointTypeError",
        "DeferredInitError",
        "FSDP",
        "FSDPError",
        "FSDPOptions",
        "FSDPTypeError",
        "FullyShardedDataParallel",
        "MeshAxisError",
        "MixedPrecision",
        "OutputSharding",
        "SizeWrapPolicy",
        "TransformerWrapPolicy",
        "WrapPolicy",
        "WrapPolicyError",
        "deferred_init",
        "fully_shard",
        "size_based_auto_wrap_policy",
        "transformer_auto_wrap_policy",
    ],
    "fsdp_xla.api": ["FSDP", "FullyShardedDataParallel", "OutputSharding", "fully_shard"],
    "fsdp_xla.checkpoint": [
        "FORMAT",
        "checkpoint_version",
        "consolidate",
        "has_checkpoint",
        "load_sharded",
        "save_sharded",
    ],
    "fsdp_xla.communication": [
        "CollectiveRecord",
        "Phase",
        "attribute",
        "bytes_by_phase",
        "counts_by_unit",
        "dtensor_traffic_mode",
        "zero3_minimum_bytes",
    ],
    "fsdp_xla.consolidate": ["build_parser", "main", "write_state_dict"],
    "fsdp_xla.deferred": [
        "check_materializable",
        "deferred_init",
        "materialize_unit",
        "module_seed",
        "needs_materialization",
        "params_on_meta",
    ],
    "fsdp_xla.errors": [
        "CheckpointError",
        "CheckpointTypeError",
        "DeferredInitError",
        "FSDPError",
        "FSDPTypeError",
        "MeshAxisError",
        "WrapPolicyError",
    ],
    "fsdp_xla.hf": [
        "DEFAULT_AXIS_RULES",
        "FSDPTrainer",
        "HFConfigError",
        "HFFSDPConfig",
        "IGNORED_KEYS",
        "IGNORED_XLA_SETTINGS",
        "TrainingArguments",
        "gpt2_plan",
        "llama_plan",
        "read_fsdp_config",
    ],
    "fsdp_xla.hf.arguments": ["TrainingArguments"],
    "fsdp_xla.hf.config": ["HFConfigError", "HFFSDPConfig", "IGNORED_KEYS", "IGNORED_XLA_SETTINGS", "read_fsdp_config"],
    "fsdp_xla.hf.config_keys": ["IGNORED_KEYS", "IGNORED_XLA_SETTINGS", "MAPPED_KEYS", "MAPPED_SETTINGS"],
    "fsdp_xla.hf.plans": ["DEFAULT_AXIS_RULES", "gpt2_plan", "llama_plan"],
    "fsdp_xla.hf.trainer": ["FSDPTrainer", "batch_axes", "batch_sharding"],
    "fsdp_xla.policies": [
        "MixedPrecision",
        "SizeWrapPolicy",
        "TransformerWrapPolicy",
        "WrapPolicy",
        "size_based_auto_wrap_policy",
        "transformer_auto_wrap_policy",
    ],
    "mesh": [
        "AxisRef",
        "DeviceCountError",
        "DeviceInfo",
        "GlobalMeshFollower",
        "HybridMesh",
        "Mesh",
        "MeshError",
        "MeshTypeError",
        "NoMeshError",
        "as_mesh",
        "follow_global_mesh",
        "get_1d_mesh",
        "get_global_mesh",
        "hybrid_device_order",
        "mesh_or_global",
        "set_global_mesh",
        "use_mesh",
    ],
    "mesh.errors": ["DeviceCountError", "MeshError", "MeshTypeError", "NoMeshError"],
    "spmd": [
        "AxisIndexError",
        "BACKENDS",
        "CollectiveTimeoutError",
        "DataPosition",
        "DataPositionError",
        "DeviceCountError",
        "DuplicateAxisError",
        "HloSharding",
        "HloShardingError",
        "HybridMesh",
        "IndivisibleBatchError",
        "LocalShapeMismatchError",
        "MarkShardingFunction",
        "Mesh",
        "MissingSpecError",
        "NamedSharding",
        "NoMeshError",
        "NotAnXlaTensorError",
        "P",
        "PartialPlacementError",
        "PartitionSpec",
        "PartitionSpecTypeError",
        "PlacementDimError",
        "PlacementError",
        "ProcessDataError",
        "ProcessDataLoader",
        "ProcessSampler",
        "Shard",
        "ShardBounds",
        "ShardLoadError",
        "ShardableLayerNorm",
        "ShardedTensor",
        "ShardingBackend",
        "ShardingConflictError",
        "ShardingError",
        "ShardingKind",
        "ShardingSpec",
        "ShardingType",
        "SpecRankError",
        "SpmdModeError",
        "SpmdTypeError",
        "UnknownAxisError",
        "XLAShard",
        "XLAShardedTensor",
        "annotate_custom_sharding",
        "api",
        "apply_backward_optimization_barrier",
        "auto_policy",
        "backend_for",
        "clear_sharding",
        "compat",
        "configure_default_devices",
        "debugging",
        "device_count",
        "device_mesh",
        "disable_manual_sharding",
        "distribute_module",
        "distribute_tensor",
        "enable_manual_sharding",
        "enable_spmd",
        "get_1d_mesh",
        "get_global_mesh",
        "get_sharding",
        "hlo_sharding_for",
        "init_device_mesh",
        "init_process_group",
        "layer_norm",
        "make_global_batch",
        "make_global_tensor",
        "mark_manual_sharding",
        "mark_sharding",
        "mark_sharding_with_gradients",
        "optimization_barrier",
        "placements_from_spec",
        "process_rows",
        "resolve_spec",
        "set_global_mesh",
        "shard_as",
        "shard_parameters",
        "sharding_spec",
        "spec_from_placements",
        "step",
        "use_backend",
        "use_mesh",
        "use_shardable_layer_norm",
        "visualize_sharding",
        "watch_collectives",
        "with_sharding_constraint",
        "wrap_if_sharded",
        "xla_distribute_module",
        "xla_distribute_tensor",
        "xla_sharded_tensor",
        "xla_sharding",
    ],
    "spmd.atomic_file": ["atomic_write", "file_to_write"],
    "spmd.barrier": ["apply_backward_optimization_barrier", "optimization_barrier"],
    "spmd.cli_args": ["finite_float", "input_file", "int_in", "output_dir", "output_file"],
    "spmd.compat": ["api", "debugging", "sharding_spec", "xla_mesh", "xla_sharded_tensor", "xla_sharding"],
    "spmd.compat.api": [
        "MeshSizeError",
        "auto_policy",
        "convert_to_xla_mesh",
        "convert_to_xla_partition_spec",
        "xla_distribute_module",
        "xla_distribute_tensor",
    ],
    "spmd.compat.debugging": ["visualize_sharding", "visualize_tensor_sharding"],
    "spmd.compat.sharding_spec": ["ShardingSpec"],
    "spmd.compat.xla_mesh": ["HybridMesh", "Mesh", "TorchXlaGlobalMesh", "get_1d_mesh"],
    "spmd.compat.xla_sharded_tensor": ["XLAShard", "XLAShardedTensor"],
    "spmd.compat.xla_sharding": [
        "HybridMesh",
        "MarkShardingFunction",
        "Mesh",
        "PartitionSpec",
        "ShardingSpec",
        "ShardingType",
        "XLAShard",
        "XLAShardedTensor",
        "annotate_custom_sharding",
        "apply_backward_optimization_barrier",
        "clear_sharding",
        "disable_manual_sharding",
        "enable_manual_sharding",
        "get_1d_mesh",
        "get_global_mesh",
        "mark_sharding",
        "mark_sharding_with_gradients",
        "set_global_mesh",
        "shard_as",
        "unwrap_sharded_tensor",
        "wrap_as_sharded_tensor",
        "wrap_if_sharded",
    ],
    "spmd.data_loader": ["DataPosition", "ProcessDataLoader", "ProcessSampler"],
    "spmd.devices": ["MAX_DEVICES", "configure_default_devices", "enable_spmd", "has_tpu"],
    "spmd.distribute": [
        "device_count",
        "device_mesh",
        "distribute_module",
        "distribute_tensor",
        "init_device_mesh",
        "step",
    ],
    "spmd.errors": [
        "AxisIndexError",
        "CollectiveTimeoutError",
        "DataPositionError",
        "DeviceCountError",
        "DuplicateAxisError",
        "HloShardingError",
        "IndivisibleBatchError",
        "LocalShapeMismatchError",
        "MissingSpecError",
        "NoMeshError",
        "NotAnXlaTensorError",
        "PartitionSpecTypeError",
        "ProcessDataError",
        "ShardLoadError",
        "ShardingConflictError",
        "ShardingError",
        "SpecRankError",
        "SpmdModeError",
        "SpmdTypeError",
        "TorchXlaNotInstalledError",
        "UnknownAxisError",
    ],
    "spmd.hang_report": ["describe_collective", "is_collective_failure", "silent_ranks", "watch_collectives"],
    "spmd.hlo_sharding": ["HloSharding", "ShardBounds", "ShardingKind", "iota_device_ids"],
    "spmd.inspector": [
        "ArrayShape",
        "Capture",
        "CheckOptions",
        "Collective",
        "CollectiveKind",
        "Finding",
        "GraphReport",
        "HloModuleText",
        "InspectorError",
        "MemoryUsage",
        "ParameterInfo",
        "Report",
        "UnknownGraphError",
        "WarningCode",
        "capture",
        "find_issues",
        "format_bytes",
        "list_modules",
        "prepare",
        "read_graph",
        "ring_bytes_sent",
    ],
    "spmd.inspector.capture": ["Capture", "InspectorError", "capture"],
    "spmd.inspector.checks": ["CheckOptions", "IMPLICIT_GRAPH", "find_issues"],
    "spmd.inspector.cli": ["build_parser", "main"],
    "spmd.inspector.collectives": [
        "Collective",
        "CollectiveKind",
        "collectives_of",
        "mesh_axes_groups",
        "module_scope",
        "parse_replica_groups",
        "ring_bytes_sent",
        "short_source",
    ],
    "spmd.inspector.dump": ["ParameterNamer", "dump_dir_from_flags", "list_modules", "prepare", "read_graph"],
    "spmd.inspector.hlo_shape": ["ArrayShape", "DTYPE_BYTES", "parse_shape"],
    "spmd.inspector.hlo_text": [
        "ArrayShape",
        "DTYPE_BYTES",
        "HloModuleText",
        "Instruction",
        "annotation_scopes",
        "module_scope",
        "parse_shape",
    ],
    "spmd.inspector.memory": ["Allocation", "MemoryUsage"],
    "spmd.inspector.report": [
        "Finding",
        "GraphReport",
        "ParameterInfo",
        "Report",
        "UnknownGraphError",
        "WarningCode",
        "format_bytes",
    ],
    "spmd.layer_norm": ["LayerNormShapeError", "ShardableLayerNorm", "layer_norm", "use_shardable_layer_norm"],
    "spmd.manual": ["disable_manual_sharding", "enable_manual_sharding", "mark_manual_sharding"],
    "spmd.mark_sharding": [
        "MarkShardingFunction",
        "annotate_custom_sharding",
        "clear_sharding",
        "get_sharding",
        "mark_sharding",
        "mark_sharding_with_gradients",
        "resolve_sharding",
        "shard_as",
        "with_sharding_constraint",
    ],
    "spmd.mfu": [
        "CHIPS",
        "Chip",
        "TransformerShape",
        "chip_for_device_kind",
        "matmul_flops_per_token",
        "measure_cpu_peak_flops",
        "mfu",
        "palm_flops_per_token",
        "six_n_flops_per_token",
    ],
    "spmd.mfu.flops": ["TransformerShape", "matmul_flops_per_token", "palm_flops_per_token", "six_n_flops_per_token"],
    "spmd.mfu.peak": ["CHIPS", "Chip", "chip_for_device_kind", "measure_cpu_peak_flops"],
    "spmd.named_sharding": ["NamedSharding", "hlo_sharding_for", "resolve_spec"],
    "spmd.parameters": ["shard_parameters"],
    "spmd.partition_spec": ["P", "PartitionSpec", "SpecEntry"],
    "spmd.placements": [
        "PartialPlacementError",
        "PlacementDimError",
        "PlacementError",
        "is_placements",
        "placements_from_spec",
        "spec_from_placements",
    ],
    "spmd.plan": [
        "Advice",
        "Attention",
        "BUILTIN_CONFIGS",
        "CHIP_SPECS",
        "CompilerVersionError",
        "ModelSpecError",
        "PlanError",
        "PlanReport",
        "Remat",
        "STRATEGIES",
        "StandInReachedError",
        "TopologyError",
        "TpuSlice",
        "TracingError",
        "advise",
        "auto_mesh_shape",
        "parse_slice",
        "plan",
    ],
    "spmd.plan.advice": ["Advice", "Candidate", "Outcome"],
    "spmd.plan.advice_text": ["advice_table", "winner_code"],
    "spmd.plan.advisor": ["Advice", "Candidate", "Outcome", "advise", "candidates_for", "default_cache_dir"],
    "spmd.plan.api": [
        "DEFAULT_SEQ_LEN",
        "PlanError",
        "STRATEGIES",
        "auto_mesh_shape",
        "check_even_splits",
        "default_seq_len",
        "param_spec_for",
        "plan",
        "resolve_seq_len",
        "tpu_devices",
        "uneven_splits",
    ],
    "spmd.plan.attention": ["Attention", "causal_without_mask", "route_attention", "splash_block"],
    "spmd.plan.compile": ["CompiledStep", "compile_step", "largest_buffers", "oom_used_bytes", "report_buffers"],
    "spmd.plan.errors": [
        "CompilerVersionError",
        "ModelSpecError",
        "PlanError",
        "StandInReachedError",
        "TopologyError",
        "TracingError",
    ],
    "spmd.plan.estimate": ["StepEstimate", "estimate_step", "model_flops"],
    "spmd.plan.lowering": ["LoweredStep", "TrainStepConfig", "find_layer_stack", "lower_train_step", "to_jax_spec"],
    "spmd.plan.meshes": [
        "MESH_AXES",
        "STRATEGIES",
        "auto_mesh_shape",
        "batch_axes",
        "build_mesh",
        "check_mesh",
        "tpu_devices",
    ],
    "spmd.plan.models": [
        "BUILTIN_CONFIGS",
        "DEFAULT_SEQ_LEN",
        "MAX_SEQ_LEN",
        "ModelSpecError",
        "build_meta_model",
        "default_seq_len",
        "parameters_on_meta",
        "resolve_seq_len",
    ],
    "spmd.plan.plan_cache": ["CACHE_FORMAT", "Settings", "default_cache_dir", "model_key", "run_candidate"],
    "spmd.plan.plot": ["plot_advice", "plot_report"],
    "spmd.plan.program": ["StepCollective", "splash_kernels", "step_collectives", "trip_count"],
    "spmd.plan.published": ["PUBLISHED", "Published", "published_for"],
    "spmd.plan.recompile": [
        "RecompileError",
        "before_optimizations_path",
        "compile_hlo_for_tpu",
        "tpu_step_collectives",
    ],
    "spmd.plan.remat": ["BLOCK_INPUT", "Remat", "jax_policy", "recompute_factor"],
    "spmd.plan.report": ["CollectiveSummary", "MemoryReport", "PlanReport", "StepEstimate", "summarize"],
    "spmd.plan.report_text": ["plan_table"],
    "spmd.plan.specs": [
        "SpecFn",
        "argument_bytes",
        "block_bytes",
        "check_even_splits",
        "param_spec_for",
        "state_bytes",
        "uneven_splits",
    ],
    "spmd.plan.topology": [
        "CHIP_SPECS",
        "ChipSpec",
        "MAX_CHIPS",
        "MAX_CHIPS_PER_SLICE",
        "MAX_SLICES",
        "TopologyError",
        "TpuSlice",
        "parse_slice",
    ],
    "spmd.process_data": ["make_global_batch", "make_global_tensor", "process_rows"],
    "spmd.process_group": ["Beat", "Heartbeat", "heartbeat", "init_process_group", "timeouts_for"],
    "spmd.process_layout": ["DimSlot", "ProcessLayout"],
    "spmd.regular_file": ["read_regular_file"],
    "spmd.sharded_tensor": [
        "Shard",
        "ShardedTensor",
        "XLAShard",
        "XLAShardedTensor",
        "unwrap_sharded_tensor",
        "wrap_as_sharded_tensor",
        "wrap_if_sharded",
    ],
    "spmd.sharding_plan": ["LogicalAxisRules", "ShardingPlan", "UnmatchedParameterError"],
    "spmd.sharding_type": ["ShardingType", "sharding_type_of"],
    "spmd.visualize": ["ShardingLayout", "sharding_layout", "visualize_sharding"],
    "spmd.xla_log": ["REPEATED_NOTICES", "show_repeated_notices_once"],
}

# torch_xla 2.9's ``torch_xla.distributed.spmd.__all__``.
TORCH_XLA_29_SPMD = [
    "auto_policy",
    "XLAShard",
    "XLAShardedTensor",
    "Mesh",
    "HybridMesh",
    "ShardingType",
    "ShardingSpec",
    "XLAPatchedLinear",
    "MarkShardingFunction",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "shard_as",
    "annotate_custom_sharding",
    "clear_sharding",
    "get_1d_mesh",
    "wrap_if_sharded",
    "xla_distribute_tensor",
    "xla_distribute_module",
    "xla_patched_nn_linear_forward",
    "set_global_mesh",
    "get_global_mesh",
    "_mark_manual_sharding",
    "enable_manual_sharding",
    "disable_manual_sharding",
    "apply_backward_optimization_barrier",
]
# torch_xla's own objects: they resolve only where torch_xla is installed.
TORCH_XLA_OWN = {"XLAPatchedLinear", "xla_patched_nn_linear_forward"}


def _import_quietly(path: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(path)


@pytest.mark.parametrize("module", sorted(ALL_AT_BD70236))
def test_every_name_of_bd70236_still_resolves(module):
    mod = _import_quietly(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        missing = [name for name in ALL_AT_BD70236[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lost {missing}"


def test_checkpoint_error_is_back_on_fsdp_xla_checkpoint():
    from fsdp_xla.checkpoint import CheckpointError
    from fsdp_xla.errors import CheckpointError as home

    assert CheckpointError is home


def _documented_module_paths() -> set[str]:
    sources = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    sources += [*(ROOT / "examples").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    found = re.compile(r"^\s*(?:from|import)\s+((?:mesh|spmd|fsdp_xla)(?:\.\w+)*)", re.MULTILINE)
    paths = {m.group(1) for src in sources for m in found.finditer(src.read_text())}
    paths |= {
        m.group(1)
        for src in sources
        if src.suffix == ".md"
        for m in re.finditer(r"python -m ((?:spmd|fsdp_xla)(?:\.\w+)*)", src.read_text())
    }
    return paths


def test_the_scan_finds_the_documented_paths():
    paths = _documented_module_paths()
    assert {"spmd", "mesh", "fsdp_xla", "spmd.xla_log"} <= paths  # so the scan cannot pass empty


@pytest.mark.parametrize("path", sorted(_documented_module_paths()))
def test_every_documented_module_path_resolves(path):
    try:
        _import_quietly(path)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in ("torch_xla", "transformers", "accelerate"):
            pytest.skip(f"{path} needs {e.name}")
        raise


def test_the_facade_is_small_and_our_own():
    assert len(spmd.__all__) <= 46  # 45 after round 4; round 5 adds context_parallel
    assert len(spmd.__all__) == len(set(spmd.__all__))
    errors = set(spmd.errors.__all__)
    assert not errors & set(spmd.__all__), "exceptions live in spmd.errors, not in spmd.__all__"
    assert not {"XLAShard", "XLAShardedTensor", "ShardingType", "Shard", "xla_distribute_tensor"} & set(spmd.__all__)


@pytest.mark.parametrize("name", TORCH_XLA_29_SPMD)
def test_every_torch_xla_29_name_resolves_on_spmd(name):
    if name in TORCH_XLA_OWN and importlib.util.find_spec("torch_xla") is None:
        pytest.skip("torch_xla's own object: only where torch_xla is installed")
    assert getattr(spmd, name) is getattr(spmd.compat, name)


def test_compat_lists_torch_xla_29s_names():
    assert sorted(spmd.compat.TORCH_XLA_NAMES) == sorted(TORCH_XLA_29_SPMD)


def test_every_exception_resolves_on_its_package():
    import fsdp_xla
    import fsdp_xla.errors
    import mesh
    import mesh.errors

    for package, errors in ((spmd, spmd.errors), (fsdp_xla, fsdp_xla.errors), (mesh, mesh.errors)):
        for name in errors.__all__:
            assert getattr(package, name) is getattr(errors, name)


def test_spmd_shard_is_the_record_and_says_so():
    with pytest.warns(DeprecationWarning, match=r"spmd.compat.XLAShard.*torch.distributed.tensor.Shard"):
        record = spmd.Shard
    assert record is spmd.compat.XLAShard


@pytest.mark.parametrize("old", sorted(_moved.MOVED_MODULES))
def test_a_moved_module_path_warns_with_its_new_path(old):
    import sys

    new = _moved.MOVED_MODULES[old][0]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__.name == new  # the module keeps its own spec


def test_old_imports_of_the_issue_work():
    import sys

    for old in ("spmd.partition_spec", "spmd.sharding_plan"):
        sys.modules.pop(old, None)
    namespace: dict = {}
    with pytest.warns(DeprecationWarning, match="spmd.partition_spec moved"):
        exec("from spmd.partition_spec import PartitionSpec", namespace)
    assert namespace["PartitionSpec"] is spmd.PartitionSpec
    with pytest.warns(DeprecationWarning, match="spmd.sharding_plan moved to spmd.logical_axes"):
        exec("import spmd.sharding_plan", namespace)
    assert namespace["spmd"].sharding_plan.ShardingPlan is importlib.import_module("spmd.logical_axes").ShardingPlan


def test_public_modules_define_all():
    """Each public module of the new layout lists its names (the facade rule, as jax/sharding.py)."""
    for path in ("spmd", "spmd.sharding", "spmd.multiprocess", "spmd.errors", "spmd.compat", "spmd.logical_axes"):
        tree = ast.parse(Path(importlib.import_module(path).__file__).read_text())
        assert any(
            isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets) for n in tree.body
        ), path


# Every public module path and ``__all__`` name at 70ecea2 (round 4's end), and its moved paths
# (tests/data/public_api_70ecea2.json, generated from ``git archive 70ecea2`` on both lanes).
AT_70ECEA2 = json.loads((ROOT / "tests" / "data" / "public_api_70ecea2.json").read_text())
HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None


def _deprecations(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = call()
    return value, [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


def test_the_70ecea2_listing_is_whole():
    modules = AT_70ECEA2["modules"]
    assert len(modules) >= 77 and sum(map(len, modules.values())) >= 531
    assert {"spmd", "spmd.sharding", "mesh", "fsdp_xla", "spmd.plan", "spmd.inspector"} <= set(modules)


@pytest.mark.parametrize("module", sorted(AT_70ECEA2["modules"]))
def test_every_public_path_and_name_of_70ecea2_still_resolves(module):
    if module in _moved.MOVED_MODULES:  # moved since: it warns, naming where it lives now
        sys.modules.pop(module, None)
        mod, warned = _deprecations(lambda: importlib.import_module(module))
        assert any(_moved.MOVED_MODULES[module][0] in w for w in warned), warned
    else:
        mod, warned = _deprecations(lambda: importlib.import_module(module))
        assert warned == [], f"{module} is a public path: importing it should not warn ({warned})"
    torch_xla_only = set(AT_70ECEA2["torch_xla_only"].get(module, ()))
    missing, silent = [], []
    for name in AT_70ECEA2["modules"][module]:
        if name in torch_xla_only and not HAS_TORCH_XLA:
            continue
        try:
            _, warned = _deprecations(lambda n=name: getattr(mod, n))
        except AttributeError:
            missing.append(name)
            continue
        silent += [f"{name}: {w}" for w in warned if not re.search(r"(spmd|mesh|fsdp_xla|torch)\.\w", w)]
    assert not missing, f"{module} lost {missing}"
    assert not silent, f"a moved name's warning must name where it lives now: {silent}"


@pytest.mark.parametrize("old", AT_70ECEA2["moved_modules"])
def test_every_moved_path_of_70ecea2_still_imports_and_warns_with_the_new_path(old):
    assert old in _moved.MOVED_MODULES
    sys.modules.pop(old, None)  # the alias only: the module at its new path stays loaded
    module, warned = _deprecations(lambda: importlib.import_module(old))
    new = _moved.MOVED_MODULES[old][0]
    assert module is importlib.import_module(new)
    assert any(new in w for w in warned), warned


@pytest.mark.parametrize("name", ["EinsumLinear", "apply_xla_patch_to_nn_linear"])
def test_the_two_names_round_4_dropped_from_spmd_resolve_with_a_warning(name):
    """In aa7eff7's ``spmd.__all__`` (where torch_xla is installed); round 4 dropped them."""
    if not HAS_TORCH_XLA:
        with pytest.warns(DeprecationWarning, match=rf"spmd\.{name} is torch_xla's .*spmd\.compat\.xla_sharding"):
            with pytest.raises(spmd.errors.TorchXlaNotInstalledError):
                getattr(spmd, name)
        return
    value, warned = _deprecations(lambda: getattr(spmd, name))
    import torch_xla.distributed.spmd.xla_sharding as upstream

    assert value is getattr(upstream, name) is spmd.compat.xla_sharding.reexported(name)
    assert warned and "spmd.compat.xla_sharding" in warned[0] and f"xla_sharding.{name}" in warned[0]
