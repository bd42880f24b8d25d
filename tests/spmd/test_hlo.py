"""``spmd.hlo``: the HLO text reader is public on its own path (the inspector, the planner and
fsdp_xla read HLO through it); its old paths in the inspector are the same module, with a warning."""

import importlib
import sys

import pytest

import spmd.hlo


def test_the_reader_is_public_and_whole():
    for name in spmd.hlo.__all__:
        assert not name.startswith("_") and hasattr(spmd.hlo, name), name
    module = spmd.hlo.HloModuleText.parse(
        "HloModule m, num_partitions=2\n\nENTRY %e (p: f32[4]) -> f32[4] {\n  ROOT %p = f32[4]{0} parameter(0)\n}\n"
    )
    assert module.num_partitions == 2 and module.parameters()[0].arrays == (spmd.hlo.ArrayShape("f32", (4,)),)
    assert spmd.hlo.parse_replica_groups("[2,2]<=[4]", 4) == ((0, 1), (2, 3))


@pytest.mark.parametrize("old", ["spmd.inspector.hlo_text", "spmd.inspector.hlo_shape"])
def test_the_inspectors_old_paths_warn_and_are_the_same_module(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to spmd.hlo"):
        module = importlib.import_module(old)
    assert module is spmd.hlo


def test_the_inspectors_collectives_keep_the_replica_group_readers():
    from spmd.inspector import collectives

    assert collectives.parse_replica_groups is spmd.hlo.parse_replica_groups
    assert collectives.mesh_axes_groups is spmd.hlo.mesh_axes_groups
