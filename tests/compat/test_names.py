"""Every public name of torch_xla's SPMD modules exists in ours, and the docs list the intended differences."""

import re
from pathlib import Path

import spmd
import spmd.xla_sharding
from tests.compat.run_torch_xla_spmd_tests import INTENDED_DIFFERENCES

ROOT = Path(__file__).resolve().parents[2]


def test_every_torch_xla_spmd_name_is_ours(xla):
    import torch_xla.distributed.spmd as xs
    import torch_xla.distributed.spmd.xla_sharding as xla_sharding

    # torch_xla's __all__ misses a comma ("MarkShardingFunction" "mark_sharding"): read its names.
    theirs = {n for n in dir(xs) if not n.startswith("__")} - {"api", "xla_sharded_tensor", "xla_sharding"}
    theirs |= {"MarkShardingFunction", "mark_sharding"}
    missing = sorted(n for n in theirs if not hasattr(spmd, n))
    assert missing == []
    defined_there = "torch_xla.distributed.spmd"  # not helpers it imports from torch_xla._internal
    public = {
        n
        for n, v in vars(xla_sharding).items()
        if not n.startswith("_") and callable(v) and getattr(v, "__module__", "").startswith(defined_there)
    }
    public.discard("aot_mark_sharding_fake")  # the fake kernel of its custom op, registered at import
    missing = sorted(n for n in public if not hasattr(spmd.xla_sharding, n))
    assert missing == [], "torch_xla's xla_sharding names without a counterpart in spmd.xla_sharding"


def test_our_own_objects_not_torch_xla_ones():
    for name in ("Mesh", "HybridMesh", "mark_sharding", "XLAShardedTensor", "ShardingSpec", "enable_manual_sharding"):
        assert getattr(spmd, name).__module__.split(".")[0] in ("spmd", "mesh"), name


def test_docs_list_every_intended_difference():
    text = (ROOT / "docs" / "migration.md").read_text()
    documented = set(re.findall(r"^\| `(test_\w+)` \|", text, flags=re.MULTILINE))
    assert documented == set(INTENDED_DIFFERENCES)
