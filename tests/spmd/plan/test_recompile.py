"""spmd.plan.compile.recompile without a compile: which dump it reads, and what it refuses."""

import pytest

from spmd.plan.compile.recompile import RecompileError, before_optimizations_path, tpu_step_collectives


def test_the_unoptimized_dump_beside_an_optimized_one(tmp_path):
    after = tmp_path / "module_0003.FSDPForwardBackward.12.cpu_after_optimizations.txt"
    before = tmp_path / "module_0003.FSDPForwardBackward.12.before_optimizations.txt"
    after.write_text("")
    with pytest.raises(RecompileError, match="No unoptimized dump module_0003.FSDPForwardBackward.12.before"):
        before_optimizations_path(after)
    before.write_text("")
    assert before_optimizations_path(after) == before


def test_refuses_what_it_cannot_compile(tmp_path):
    buffers = tmp_path / "module_0003.G.cpu_after_optimizations-buffer-assignment.txt"
    with pytest.raises(RecompileError, match="is not an optimized HLO dump"):
        before_optimizations_path(buffers)
    after = tmp_path / "module_0003.G.cpu_after_optimizations.txt"
    (tmp_path / "module_0003.G.before_optimizations.txt").write_text("")
    with pytest.raises(RecompileError, match="No TPU v5e slice of 6 chips"):
        tpu_step_collectives(after, 6)
