"""ShardingPlan and LogicalAxisRules check what they are built from: a bad regex, rules that are
not (logical axis, mesh axes) pairs, axes that are not rules, and a non-bool strict fail when the
plan is built, not at the first parameter."""

import numpy as np
import pytest

from mesh import Mesh
from spmd.errors import ShardingError, SpmdTypeError
from spmd.logical_axes import LogicalAxisRules, ShardingPlan

RULES = LogicalAxisRules((("embed", "fsdp"), ("mlp", ("fsdp", "tensor")), ("norm", None)))


def test_a_plan_built_from_lists_is_the_same_value():
    plan = ShardingPlan([[r"fc\.weight$", ["embed", None]]], LogicalAxisRules([["embed", "fsdp"]]))
    again = ShardingPlan(((r"fc\.weight$", ("embed", None)),), LogicalAxisRules((("embed", "fsdp"),)))
    assert plan == again and hash(plan) == hash(again)
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    assert plan.spec_for("model.fc.weight", (16, 4), mesh) == again.spec_for("model.fc.weight", (16, 4), mesh)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: LogicalAxisRules(5), SpmdTypeError, "rules is a sequence of pairs such as"),
        (lambda: LogicalAxisRules("embed"), SpmdTypeError, "got 'embed'"),
        (lambda: LogicalAxisRules(((5, "fsdp"),)), SpmdTypeError, r"rules\[0\] is \(5, 'fsdp'\)"),
        (lambda: LogicalAxisRules((("embed", 3),)), SpmdTypeError, "maps 'embed' to 3"),
        (lambda: LogicalAxisRules((("embed", ()),)), SpmdTypeError, r"maps 'embed' to \(\)"),
        (lambda: ShardingPlan(((r"(", ("embed",)),), RULES), ShardingError, r"regex '\(' does not compile"),
        (lambda: ShardingPlan(((r"w", "embed"),), RULES), SpmdTypeError, "gives 'embed' for 'w'"),
        (lambda: ShardingPlan(((r"w", ("embed",)),), "x"), SpmdTypeError, "axes is a LogicalAxisRules"),
        (lambda: ShardingPlan(((r"w", ("embed",)),), RULES, strict="no"), SpmdTypeError, "strict takes True or False"),
        (lambda: ShardingPlan(5, RULES), SpmdTypeError, "params is a sequence of pairs"),
    ],
)
def test_bad_parts_fail_when_the_plan_is_built(build, error, match):
    with pytest.raises(error, match=match):
        build()
