"""Report values: totals, JSON (atomic, with the HLO copied beside it), the table, checks."""

import json

import pytest

from spmd.inspector import (
    ArrayShape,
    CheckOptions,
    Collective,
    CollectiveKind,
    GraphReport,
    MemoryUsage,
    ParameterInfo,
    Report,
    UnknownGraphError,
    WarningCode,
    find_issues,
    format_bytes,
)


def make_graph(tmp_path, module_id=0, step=0):
    hlo = tmp_path / f"module_{module_id:04d}.G.cpu_after_optimizations.txt"
    hlo.write_text("HloModule G, num_partitions=8\n")
    weight = ParameterInfo(
        0, ArrayShape("f32", (128, 1024)), ArrayShape("f32", (1024, 1024)), "{devices=[8,1]0,1,2,3,4,5,6,7}", "w"
    )
    bias = ParameterInfo(1, ArrayShape("f32", (1024, 512)), ArrayShape("f32", (1024, 512)), "{replicated}", "")
    gather = Collective(
        kind=CollectiveKind.ALL_GATHER,
        name="ag",
        arrays=(ArrayShape("f32", (1024, 1024)),),
        operand_arrays=(ArrayShape("f32", (128, 1024)),),
        group_size=8,
        num_groups=1,
        dimensions=(0,),
        bytes_sent_per_device=7 << 19,
        op_type="aten__mm",
        op_name="M.1/layer.2/aten__mm",
        source="t.py:3",
        source_parameter=0,
    )
    memory = MemoryUsage(10_000_000, 2_621_440, 0, 0, 4_194_304, ())
    return GraphReport("G", module_id, 8, memory, (weight, bias), (gather,), str(hlo), step)


def test_format_bytes():
    assert format_bytes(12) == "12 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 << 30) == "3.00 GiB"


def test_totals_and_json(tmp_path):
    g = make_graph(tmp_path)
    report = Report((g,), devices=8, platform="CPU", steps={0: (0,)}, dump_dir=str(tmp_path))
    assert report.peak_bytes == 10_000_000
    assert report.bytes_sent_per_device == 7 << 19
    assert report.collective_counts() == {"all-gather": 1}
    assert report.graph("G") is g and report.graph() is g
    with pytest.raises(UnknownGraphError, match="No graph at position 5; the report has 1: \\['G'\\]"):
        report.graph(5)  # was a bare IndexError
    with pytest.raises(ValueError, match="max_collectives must be a whole number >= 0, got -1"):
        report.table(max_collectives=-1)
    with pytest.raises(KeyError, match="No graph named 'H'"):
        report.graph("H")
    path = report.write_json(tmp_path / "out" / "r.json")
    data = json.loads(path.read_text())
    assert data["totals"]["bytes_sent_per_device"] == 7 << 19
    assert data["steps"] == [
        {
            "step": 0,
            "graphs": ["G"],
            "collectives": {"all-gather": 1},
            "bytes_sent_per_device": 7 << 19,
            "peak_bytes_per_device": 10_000_000,
        }
    ]
    (c,) = data["graphs"][0]["collectives"]
    assert c["source_tensor"] == "w (parameter 0)" and c["scope"] == "layer"
    copied = tmp_path / "out" / "r.hlo" / "module_0000.G.cpu_after_optimizations.txt"
    assert data["graphs"][0]["hlo_file"] == str(copied) and copied.exists()
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_table_lists_memory_collectives_and_warnings(tmp_path):
    g = make_graph(tmp_path)
    warnings = find_issues([g], {0: [0]})
    report = Report((g,), warnings, devices=8, platform="CPU", steps={0: (0,)})
    text = report.table()
    assert "per-device peak 9.54 MiB" in text
    assert "all-gather" in text and "w (parameter 0)" in text
    assert "step 0: 1 graph(s)" in text
    assert "warning replicated-argument" in text and "warning parameter-all-gather" in text


def test_checks_thresholds_and_ignore(tmp_path):
    g = make_graph(tmp_path)
    codes = [f.code for f in find_issues([g], {0: [0]})]
    assert codes == [WarningCode.REPLICATED_ARGUMENT, WarningCode.PARAMETER_ALL_GATHER]
    assert find_issues([g], {0: [0]}, CheckOptions(replicated_threshold_bytes=8 << 20)) == ()
    assert (
        find_issues([g], {0: [0]}, CheckOptions(ignore=frozenset({"replicated-argument", "parameter-all-gather"})))
        == ()
    )
    late = find_issues(
        [g], {0: [0], 1: [], 2: [0]}, CheckOptions(ignore=frozenset({"replicated-argument", "parameter-all-gather"}))
    )
    assert [f.code for f in late] == [WarningCode.RECOMPILATION] and "step 2" in late[0].message


def test_bad_check_options():
    with pytest.raises(ValueError, match=r"Unknown warning code\(s\) \['typo'\]"):
        CheckOptions(ignore=frozenset({"typo"}))
    with pytest.raises(ValueError, match="must be a number >= 0"):
        CheckOptions(replicated_threshold_bytes=-1)


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"replicated_threshold_bytes": float("nan")}, ValueError, "replicated_threshold_bytes must be a number >= 0, got nan"),
        ({"replicated_threshold_bytes": float("inf")}, ValueError, "ignore 'replicated-argument'"),
        ({"replicated_threshold_bytes": "1"}, TypeError, "replicated_threshold_bytes must be a number >= 0, got str"),
        ({"warmup_steps": "2"}, TypeError, "warmup_steps must be a whole number >= 0, got str"),
        ({"warmup_steps": 1.5}, TypeError, "warmup_steps must be a whole number >= 0, got float 1.5"),
        ({"warmup_steps": True}, TypeError, "warmup_steps must be a whole number"),
        ({"ignore": 5}, TypeError, "ignore must be a list of warning codes"),
        ({"ignore": [["recompilation"]]}, ValueError, r"Unknown warning code\(s\) \[\['recompilation'\]\]"),
    ],
)  # fmt: skip
def test_check_options_refuse_bad_types_and_nan(options, error, match):
    """nan silenced every replicated-tensor warning; '2' and 1.5 failed later inside a comparison."""
    with pytest.raises(error, match=match):
        CheckOptions(**options)


def test_one_ignored_code_may_be_a_string():
    """``ignore="recompilation"`` was split into its letters ('unknown codes ['a', 'c', ...]')."""
    assert CheckOptions(ignore="recompilation").ignore == frozenset({"recompilation"})
    assert CheckOptions(ignore=[WarningCode.RECOMPILATION]).ignore == frozenset({"recompilation"})


def test_write_json_refuses_a_directory_and_writes_nothing(tmp_path):
    report = Report((make_graph(tmp_path),), devices=8, platform="CPU", steps={0: (0,)}, dump_dir=str(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match=r"out is a directory; give a file path \(e.g. .*out/report.json\)"):
        report.write_json(out)
    (tmp_path / "r.hlo").write_text("x")
    with pytest.raises(ValueError, match=r"r.hlo \(where the HLO files go\) is a file"):
        report.write_json(tmp_path / "r.json")
    with pytest.raises(TypeError, match="write_json takes a file path, got int"):
        report.write_json(5)
    assert list(out.iterdir()) == [] and not (tmp_path / "r.json").exists()
    assert report.write_json(tmp_path / "r.json", save_hlo=False).is_file()


def test_format_bytes_refuses_what_is_not_a_number():
    with pytest.raises(TypeError, match="format_bytes takes a number of bytes, got str 'x'"):
        format_bytes("x")
    assert format_bytes(float("nan")) == "nan B"


def test_named_graphs_in_a_step_are_not_mid_step_executions(tmp_path):
    import dataclasses

    fsdp = dataclasses.replace(make_graph(tmp_path, 0), name="FSDPForwardBackward.12")
    opt = dataclasses.replace(make_graph(tmp_path, 1), name="SyncTensorsGraph.7")
    extra = dataclasses.replace(make_graph(tmp_path, 2), name="SyncTensorsGraph.9")
    quiet = CheckOptions(ignore=frozenset({"replicated-argument", "parameter-all-gather"}))
    assert find_issues([fsdp, opt], {0: [0, 1]}, quiet) == ()
    (finding,) = find_issues([fsdp, opt, extra], {0: [0, 1, 2]}, quiet)
    assert finding.code is WarningCode.RECOMPILATION and "2 graphs" in finding.message


def test_the_backend_is_named_backend_and_lane_is_its_deprecated_alias(tmp_path):
    report = Report((make_graph(tmp_path),), devices=8, platform="CPU")
    assert report.backend == "torch_xla"
    with pytest.warns(DeprecationWarning, match="Report.lane is deprecated: use Report.backend"):
        assert report.lane == "torch_xla"
    data = report.to_dict()
    assert data["backend"] == data["lane"] == "torch_xla"
