"""Fuzz campaign over the public API's inputs: every outcome is a correct result or one of our
typed errors (a ValueError/TypeError subclass from mesh, spmd or fsdp_xla) with a message,
never an AssertionError, a C++ RuntimeError, an IndexError/KeyError/ZeroDivisionError or a hang.

The contract (issue 27): untrusted input (files, text, flags, environment) gets one of our
errors and never a wrong result; a wrong-typed Python argument may instead get Python's own
``TypeError`` when its message names the parameter and it is raised in our code, not inside a
dependency. A correct result is one that passes the target's check: a round trip, a tiling, an
agreement with JAX; "no crash" alone is not a pass.

Derandomized and bounded (a few hundred cases per target). Run with ``-s`` to see the counts:
cases tried, typed errors and correct results per target.
"""

import importlib.util
import json
import math
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdp_xla.hf import HFConfigError, read_fsdp_config
from mesh import DeviceInfo, HybridMesh, Mesh
from spmd import HloSharding, NamedSharding, PartitionSpec, get_sharding, hlo_sharding_for, mark_sharding

COUNTS: dict[str, Counter] = defaultdict(Counter)
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
OUR_PACKAGES = ("mesh", "spmd", "fsdp_xla")
HAS_JAX = importlib.util.find_spec("jax") is not None
OUTCOMES = ("typed error", "python TypeError", "correct")


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    print("\nfuzz counts (cases tried / typed errors / Python TypeErrors / correct results):")
    for target, c in sorted(COUNTS.items()):
        print(
            f"  {target:<22} {c['tried']:>5} / {c['typed error']:>5} / {c['python TypeError']:>5} / {c['correct']:>5}"
        )
    print(json.dumps({k: dict(v) for k, v in COUNTS.items()}))


def _raised_in_a_dependency(error: BaseException) -> bool:
    """Whether the innermost frame of ``error``'s traceback is an installed package's code."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and "site-packages" in Path(tb.tb_frame.f_code.co_filename).parts


def outcome(target, call, check=None, *, params=()):
    """Run ``call``. A result must pass ``check`` (give one: "no crash" is not a pass). An
    exception must be one of ours with a message or, when ``params`` names the Python arguments
    the call takes (untrusted input passes none), Python's own ``TypeError`` raised in our code
    whose message names one of them."""
    COUNTS[target]["tried"] += 1
    try:
        result = call()
    except (ValueError, TypeError) as e:
        module = type(e).__module__.split(".")[0]
        if module not in OUR_PACKAGES:
            named = any(re.search(rf"\b{re.escape(p)}\b", str(e)) for p in params)
            assert type(e) is TypeError and named, f"{target}: untyped {type(e).__name__}: {e}"
            assert not _raised_in_a_dependency(e), f"{target}: a TypeError from inside a dependency: {e}"
            COUNTS[target]["python TypeError"] += 1
            return None
        assert len(str(e)) > 15, f"{target}: {type(e).__name__} without a useful message: {e!r}"
        COUNTS[target]["typed error"] += 1
        return None
    if check is not None:
        check(result)
    COUNTS[target]["correct"] += 1
    return result


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=4),
    st.lists(st.integers(-3, 9), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
axis_name = st.sampled_from(["data", "model", "fsdp", "x", ""])
spec_entry = st.one_of(
    st.none(),
    axis_name,
    st.integers(-3, 6),
    st.tuples(axis_name, axis_name),
    st.tuples(st.integers(-2, 4), axis_name),
    junk,
)


@FUZZ
@given(entries=st.lists(spec_entry, max_size=12))
def test_partition_spec(entries):
    def check(spec):
        assert len(spec) == len(entries) and PartitionSpec.from_value(list(entries)) == spec

    outcome("PartitionSpec", lambda: PartitionSpec(*entries), check)


@st.composite
def mesh_args(draw):
    """Mostly well-formed meshes (a shape, a permutation of its ids, names), then one thing broken."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    ids = draw(st.permutations(list(range(math.prod(shape)))))
    names = draw(st.one_of(st.none(), st.just([f"a{i}" for i in range(len(shape))])))
    broken = draw(st.sampled_from(["none", "ids", "shape", "names"]))
    if broken == "ids":
        ids = draw(st.one_of(st.lists(st.integers(-2, 20), max_size=10), junk, st.just([ids, ids])))
    elif broken == "shape":
        shape = draw(st.one_of(st.lists(st.integers(-2, 2**40), max_size=4), st.integers(-3, 9), junk))
    elif broken == "names":
        names = draw(st.one_of(st.lists(st.one_of(axis_name, junk), max_size=4), junk))
    return ids, shape, names


@FUZZ
@given(args=mesh_args())
def test_mesh(args):
    ids, shape, names = args

    def check(mesh):
        assert mesh.size() == math.prod(mesh.mesh_shape) and len(set(mesh.device_ids.tolist())) == mesh.size()

    outcome("Mesh", lambda: Mesh(ids, shape, names), check)


device_info = st.builds(
    DeviceInfo,
    id=st.integers(0, 15),
    coords=st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 1))),
    core_on_chip=st.integers(0, 1),
    slice_index=st.integers(0, 2),
)


@st.composite
def hybrid_args(draw):
    """Slices of chips on a grid, most of them consistent, then one thing broken."""
    grid = draw(st.sampled_from([(2, 2, 1), (2, 1, 1), (4, 2, 1), (2, 2, 2)]))
    slices = draw(st.integers(1, 2))
    per = math.prod(grid)
    devices = [
        DeviceInfo(s * per + i, coords=(i % grid[0], i // grid[0] % grid[1], i // (grid[0] * grid[1])), slice_index=s)
        for s in range(slices)
        for i in range(per)
    ]
    ici = draw(st.sampled_from([(per,), (1, per), (grid[0], per // grid[0])]))
    dcn = (slices,) + (1,) * (len(ici) - 1)
    broken = draw(st.sampled_from(["none", "ici", "dcn", "devices"]))
    if broken == "ici":
        ici = draw(st.one_of(st.lists(st.integers(-1, 8), max_size=3), junk))
    elif broken == "dcn":
        dcn = draw(st.one_of(st.none(), st.lists(st.integers(-1, 3), max_size=3), junk))
    elif broken == "devices":
        devices = draw(st.lists(device_info, max_size=16))
    return ici, dcn, devices


@FUZZ
@given(args=hybrid_args())
def test_hybrid_mesh(args):
    ici, dcn, devices = args

    def check(mesh):
        assert sorted(mesh.device_ids.tolist()) == sorted(d.id for d in devices)

    outcome("HybridMesh", lambda: HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=dcn, devices=devices), check)


MESHES = [
    Mesh(np.arange(8), (8,), ("data",)),
    Mesh(np.arange(8), (4, 2), ("data", "model")),
    Mesh(np.arange(8)[::-1], (2, 2, 2), ("x", "data", "model")),
    Mesh(np.arange(8), (1, 8), None),
]


@FUZZ
@given(
    mesh=st.sampled_from(MESHES),
    entries=st.lists(spec_entry, max_size=5),
    shape=st.lists(st.integers(0, 17), max_size=6),
)
def test_named_sharding(mesh, entries, shape):
    def build():
        sharding = NamedSharding(mesh, PartitionSpec(*entries))
        return sharding, sharding.shard_bounds(shape), hlo_sharding_for(mesh, sharding.spec, len(shape), shape)

    def check(result):
        sharding, bounds, hlo = result
        assert len(bounds) == mesh.size()
        total = sum(math.prod(b.shape) for b in bounds if b.replica_id == 0)
        assert total == math.prod(shape)  # the distinct blocks tile the tensor exactly
        assert HloSharding.parse(str(hlo)) == hlo
        if HAS_JAX and _jax_can_say(mesh, sharding.spec):
            from tests.spmd.sharding.test_named_sharding import jax_hlo

            assert jax_hlo(mesh, tuple(sharding.spec), len(shape)) == hlo_sharding_for(mesh, sharding.spec, len(shape))

    outcome("NamedSharding", build, check)


def _jax_can_say(mesh, spec) -> bool:
    """JAX's PartitionSpec names axes only (no indices) on a mesh with names, and maps a
    one-device mesh to a replicated sharding where torch_xla (and we) give a maximal one."""
    names = [a for e in spec for a in (e if isinstance(e, tuple) else (e,)) if a is not None]
    return mesh.axis_names is not None and mesh.size() > 1 and all(isinstance(a, str) for a in names)


VALID_TEXTS = [
    "{replicated}",
    "{manual}",
    "{maximal device=3}",
    "{devices=[4,2]0,1,2,3,4,5,6,7}",
    "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}",
    "{devices=[4,2]<=[2,4]T(1,0)}",
]


@st.composite
def sharding_text(draw):
    text = draw(st.sampled_from(VALID_TEXTS))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        ch = draw(st.sampled_from(list("0123456789,[]{}<=T() -") + ["99999999999999999999", "last_tile_dim_replicate"]))
        if op == "insert":
            text = text[:i] + ch + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + 1 :]
        else:
            text = text[:i] + ch + text[i + 1 :]
    return text


@FUZZ
@given(text=st.one_of(sharding_text(), st.text(max_size=30)))
def test_hlo_sharding_parse(text):
    def check(h):
        assert HloSharding.parse(str(h)) == h  # what we print, we read back as the same sharding
        assert str(HloSharding.parse(str(h))) == str(h)

    outcome("HloSharding.parse", lambda: HloSharding.parse(text), check)


json_value = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**64), 2**64),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
        st.sampled_from(["GPT2Block", "bfloat16", "TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "true", "NO_WRAP"]),
    ),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=6,
)
config_key = st.sampled_from(
    [
        "xla",
        "fsdp_xla",
        "xla_fsdp_v2",
        "xla_fsdp_grad_ckpt",
        "min_num_params",
        "transformer_layer_cls_to_wrap",
        "fsdp_transformer_layer_cls_to_wrap",
        "auto_wrap_policy",
        "xla_fsdp_settings",
        "backward_prefetch",
        "limit_all_gathers",
        "activation_checkpointing",
        "nonsense",
    ]
)
settings_value = st.dictionaries(
    st.sampled_from(
        ["compute_dtype", "buffer_dtype", "shard_param_on_dim_0", "flatten_parameters", "param_init_fn", "x"]
    ),
    json_value,
    max_size=3,
)


@FUZZ
@given(
    config=st.one_of(
        st.dictionaries(config_key, st.one_of(json_value, settings_value), max_size=5),
        json_value,
    )
)
def test_read_fsdp_config(config, tmp_path_factory):
    """A config read from a dict or from its JSON file gives the same result (or the same error),
    and what is read is consistent: one wrap policy, its threshold a count."""

    def check(cfg):
        assert cfg.wrap in ("transformer", "size", "none") and cfg.min_num_params >= 0
        assert not (cfg.min_num_params > 0 and cfg.layer_classes)  # the two policies exclude each other
        assert all(isinstance(c, str) and c for c in cfg.layer_classes or ())

    from_dict = outcome("read_fsdp_config", lambda: read_fsdp_config(config, warn=False), check)
    path = tmp_path_factory.mktemp("cfg") / "fsdp_config.json"
    path.write_text(json.dumps(config, allow_nan=True))  # NaN / Infinity as Python's json writes them
    from_file = outcome("read_fsdp_config file", lambda: read_fsdp_config(path, warn=False), check)
    if isinstance(config, dict) and all(isinstance(k, str) for k in _keys(config)):
        assert from_file == from_dict  # str keys: JSON holds the same config
    else:
        assert from_dict is None  # not a dict (or a non-str key): refused


def _keys(value) -> list:
    """Every dict key in ``value``, nested ones included."""
    if isinstance(value, dict):
        return list(value) + [k for v in value.values() for k in _keys(v)]
    return [k for v in value for k in _keys(v)] if isinstance(value, list) else []


def test_malformed_json_files(tmp_path):
    for i, text in enumerate(["", "{", "[1,", '{"xla": tru}', "\x00\x01", '{"a": 1}}', "{" * 100_000, "\ufeff{}"]):
        path = tmp_path / f"c{i}.json"
        path.write_text(text)
        with pytest.raises(HFConfigError, match=rf"c{i}\.json, line \d+, column \d+: not valid JSON"):
            read_fsdp_config(path, warn=False)
        COUNTS["read_fsdp_config file"].update(["tried", "typed error"])


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool]


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    mesh=st.one_of(st.sampled_from(MESHES), st.just(Mesh(np.arange(4), (4,), ("data",))), st.just("mesh")),
    shape=st.lists(st.integers(0, 9), max_size=4),
    dtype=st.sampled_from(DTYPES),
    entries=st.lists(st.one_of(st.none(), st.sampled_from(["data", "model", "x", 0, 1]), spec_entry), max_size=5),
)
def test_mark_sharding(xla, mesh, shape, dtype, entries):
    t = torch.zeros(shape, dtype=dtype).to(xla)

    def check(view):
        expected = hlo_sharding_for(mesh, PartitionSpec(*entries), len(shape), shape)
        assert get_sharding(t) == expected and view.global_tensor is t

    outcome("mark_sharding", lambda: mark_sharding(t, mesh, entries), check, params=("mesh", "partition_spec"))


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    m=st.integers(1, 13),
    k=st.integers(1, 13),
    n=st.integers(1, 11),
    specs=st.sampled_from(
        [
            (MESHES[1], ("data", "model"), ("model", None)),
            (MESHES[0], ("data", None), (None, None)),
            (MESHES[2], (("x", "data"), None), (None, "model")),
            (MESHES[1], (None, ("data", "model")), (("data", "model"), None)),
        ]
    ),
)
def test_uneven_matmul_and_reductions_equal_cpu(xla, m, k, n, specs):
    """Shapes that do not divide by the mesh: XLA pads, and the results must not see it."""
    mesh, a_spec, b_spec = specs
    gen = torch.Generator().manual_seed(m * 100 + k * 10 + n)
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    xa, xb = a.to(xla), b.to(xla)
    mark_sharding(xa, mesh, a_spec)
    mark_sharding(xb, mesh, b_spec)
    torch.testing.assert_close((xa @ xb).cpu(), a @ b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(xa.sum(dim=0).cpu(), a.sum(dim=0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xa.amax(dim=1).cpu(), a.amax(dim=1))
    torch.testing.assert_close(xa.mean().cpu(), a.mean(), rtol=1e-5, atol=1e-5)
    COUNTS["uneven numerics"]["tried"] += 1
    COUNTS["uneven numerics"]["correct"] += 1


REGRESSIONS = [  # inputs the fuzz campaigns found untyped errors for; each is one of ours now
    ("ragged device ids", lambda: Mesh([[0, 1], [2]], (3,))),
    ("device id beyond int64", lambda: Mesh([2**70], (1,))),
    ("float ICI size", lambda: HybridMesh(ici_mesh_shape=(2.5, 4), devices=[DeviceInfo(i) for i in range(8)])),
    (
        "mixed coord lengths",
        lambda: HybridMesh(ici_mesh_shape=(2,), devices=[DeviceInfo(0, (0, 0, 0)), DeviceInfo(1, (1, 0))]),
    ),
    ("repeated devices in a sharding", lambda: HloSharding.parse("{devices=[2]0,0}")),
    ("negative dim", lambda: hlo_sharding_for(MESHES[0], PartitionSpec("data"), 2, (8, -1))),
    ("rank beyond numpy's", lambda: hlo_sharding_for(MESHES[0], PartitionSpec("data"), 70)),
    ("non-string config key", lambda: read_fsdp_config({1: True}, warn=False)),
    ("empty layer class list", lambda: read_fsdp_config({"transformer_layer_cls_to_wrap": []}, warn=False)),
    ("NUL in the config path", lambda: read_fsdp_config("fsdp\x00config.json", warn=False)),
]


@pytest.mark.parametrize("name, call", REGRESSIONS, ids=[n for n, _ in REGRESSIONS])
def test_found_by_fuzz(name, call):
    assert outcome(name, call) is None  # a typed error of ours, with a message


def test_found_by_fuzz_in_files(tmp_path):
    cases = {"a directory": tmp_path, "not UTF-8": tmp_path / "latin1.json", "deep nesting": tmp_path / "deep.json"}
    cases["not UTF-8"].write_bytes(b'{"xla": "\xe9"}')
    cases["deep nesting"].write_text("[" * 100_000 + "]" * 100_000)
    huge = tmp_path / "huge.json"
    huge.write_text('{"min_num_params": ' + "1" * 5000 + "}")
    cases["a 5000-digit number"] = huge
    for path in cases.values():
        with pytest.raises(HFConfigError):
            read_fsdp_config(path, warn=False)


def test_tensors_of_more_than_five_split_dims_are_refused_before_torch_xla(xla):
    from spmd import ShardingError

    mesh = Mesh(np.arange(8), (1, 1, 1, 1, 2, 4), tuple("abcdef"))
    t = torch.zeros(2, 2, 2, 2, 2, 4).to(xla)
    with pytest.raises(ShardingError, match="at most 5 dims"):
        mark_sharding(t, mesh, tuple("abcdef"))
