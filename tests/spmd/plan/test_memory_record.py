"""One memory record for a compiled step (issue 35): the planner's `MemoryReport` is the
inspector's `MemoryUsage` judged against a budget, filled from the compiler's
``memory_analysis()``; reports written before (``report_format`` 1) still read. Pure Python."""

import dataclasses
import json

import pytest

from spmd._util.memory import MemoryUsage
from spmd.plan.report import MemoryReport
from spmd.plan.report.plan_report import REPORT_FORMAT

GIB = 2**30
# jax's CompiledMemoryStats as a dict: the output size counts the 20 GiB written into donated arguments
STATS = {
    "argument_size_in_bytes": 100 * GIB,
    "output_size_in_bytes": 30 * GIB,
    "alias_size_in_bytes": 20 * GIB,
    "temp_size_in_bytes": 50 * GIB,
    "generated_code_size_in_bytes": 7,
    "host_temp_size_in_bytes": 3,
}


def test_the_compiler_s_analysis_fills_the_inspector_s_record_with_aliased_outputs_apart():
    usage = MemoryUsage.from_memory_analysis(STATS)
    assert type(usage) is MemoryUsage
    assert (usage.argument_bytes, usage.output_bytes, usage.alias_bytes, usage.temp_bytes) == (
        100 * GIB, 10 * GIB, 20 * GIB, 50 * GIB,
    )  # fmt: skip
    assert usage.peak_bytes == 160 * GIB  # arguments + outputs not aliased + temporaries
    assert (usage.generated_code_bytes, usage.host_temp_bytes) == (7, 3)


def test_a_missing_size_names_itself():
    with pytest.raises(KeyError, match="temp_size_in_bytes"):
        MemoryUsage.from_memory_analysis({k: v for k, v in STATS.items() if k != "temp_size_in_bytes"})


def test_the_plan_s_memory_is_that_record_judged_against_the_budget():
    m = MemoryReport.from_memory_analysis(STATS, hbm_bytes=192 * GIB, predicted_argument_bytes=99 * GIB)
    assert isinstance(m, MemoryUsage) and m.total_bytes == m.peak_bytes == 160 * GIB
    assert m.fits and m.margin_bytes == 32 * GIB and m.short_verdict() == "fits"
    tight = dataclasses.replace(m, hbm_bytes=150 * GIB)
    assert not tight.fits and tight.short_verdict() == "OOM (-10.00 GiB)"
    with pytest.raises(TypeError):
        MemoryReport(1, 0, 0, 0, 0)  # the budget is named: positional bytes beyond the record's are refused


def test_the_json_round_trips_and_a_format_1_report_still_reads():
    m = MemoryReport.from_memory_analysis(
        STATS, hbm_bytes=192 * GIB, predicted_argument_bytes=99 * GIB, largest_allocations=("1.0G bf16[8]",)
    )  # fmt: skip
    assert MemoryReport.from_dict(json.loads(json.dumps(dataclasses.asdict(m)))) == m
    format_1 = {  # what PlanReport.to_dict wrote before REPORT_FORMAT 2
        "argument_bytes": 100 * GIB, "output_bytes": 30 * GIB, "alias_bytes": 20 * GIB, "temp_bytes": 50 * GIB,
        "generated_code_bytes": 7, "predicted_argument_bytes": 99 * GIB, "hbm_bytes": 192 * GIB,
        "compiler_oom_bytes": None, "largest_allocations": ["1.0G bf16[8]"], "compiler_accepted": False,
        "host_temp_bytes": 3, "devices_per_chip": 1, "total_bytes": 160 * GIB, "margin_bytes": 32 * GIB,
    }  # fmt: skip
    assert MemoryReport.from_dict(format_1) == m
    oom = MemoryReport.from_dict({**format_1, "argument_bytes": 0, "output_bytes": 0, "alias_bytes": 0,
                                  "temp_bytes": 0, "compiler_oom_bytes": 300 * GIB})  # fmt: skip
    assert oom.peak_bytes == oom.total_bytes == 300 * GIB and not oom.fits
    assert REPORT_FORMAT == 2
