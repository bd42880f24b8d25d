"""Ranks agree before a collective (`spmd._backend.agreement`): the digest, the one message
every rank builds, and (under torchrun, 4 gloo ranks) every entry point with one rank differing.

The comparison is checked here with a stand-in runtime that returns what four ranks would
have sent; `agreement_worker.py` runs the real exchange."""

import json
import re

import pytest

from spmd._backend.agreement import SLOTS, agree, digest, ranks_text
from spmd.errors import LocalShapeMismatchError, RankDisagreementError
from tests.torchrun import WORKERS, warm_launch

WORKER = WORKERS / "agreement_worker.py"


class FourRanks:
    """A runtime whose processes 0-3 passed ``per_rank[r]`` (the fields of each)."""

    name = "dtensor-stand-in"

    def __init__(self, per_rank, calls=None):
        self.per_rank, self.calls = per_rank, calls or ["op"] * len(per_rank)
        self.exchanges = []

    def process_count(self):
        return len(self.per_rank)

    def all_process_values(self, values, *, same_length=False):
        self.exchanges.append(same_length)
        if same_length:
            return [digest(c, {k: str(v) for k, v in f.items()}) for c, f in zip(self.calls, self.per_rank)]
        return [
            tuple(json.dumps([[c, {k: str(v) for k, v in f.items()}]]).encode())
            for c, f in zip(self.calls, self.per_rank)
        ]


def test_agreeing_ranks_pay_one_fixed_size_exchange():
    runtime = FourRanks([{"spec": "P('x')", "dtype": "float32"}] * 4)
    agree(runtime, "op", {"spec": "P('x')", "dtype": "float32"}, "fix")
    assert runtime.exchanges == [True]  # the texts are exchanged only when the digests differ


def test_the_odd_rank_and_the_others_are_named_with_the_fix():
    fields = [{"spec": "P(None, 'x')", "dtype": "float32"}] * 3 + [{"spec": "P('x', None)", "dtype": "float32"}]
    with pytest.raises(RankDisagreementError) as e:
        agree(FourRanks(fields), "op", fields[0], "Pass the same spec on every rank.")
    assert str(e.value) == (
        "op: the ranks passed different arguments, spec: rank 3 P('x', None), ranks 0-2 P(None, 'x'). "
        "Pass the same spec on every rank."
    )
    assert e.value.fields == {"spec": {"P('x', None)": [3], "P(None, 'x')": [0, 1, 2]}}


def test_ranks_in_different_calls_are_told_so():
    runtime = FourRanks([{"a": 1}] * 4, calls=["mark_sharding"] * 3 + ["make_global_tensor"])
    with pytest.raises(RankDisagreementError, match=r"^The ranks are in different collective calls: rank 3 make_glo"):
        agree(runtime, "mark_sharding", {"a": 1}, "fix")


def test_a_shape_only_difference_keeps_its_older_class():
    fields = [{"local shape": "(2, 5)"}] * 2 + [{"local shape": "(3, 5)"}] * 2
    with pytest.raises(LocalShapeMismatchError, match=r"local shape: ranks 0-1 \(2, 5\), ranks 2-3 \(3, 5\)"):
        agree(FourRanks(fields), "op", fields[0], "fix", {"local shape": LocalShapeMismatchError})
    both = [{"local shape": "(2, 5)", "dtype": "f32"}] * 3 + [{"local shape": "(3, 5)", "dtype": "f64"}]
    with pytest.raises(RankDisagreementError) as e:  # more than the shape differs: the general class
        agree(FourRanks(both), "op", both[0], "fix", {"local shape": LocalShapeMismatchError})
    assert type(e.value) is RankDisagreementError


def test_a_long_value_is_shown_where_it_differs():
    names = ", ".join(f"layer{i}.weight (64, 64)" for i in range(200))
    fields = [{"parameters": names}] * 3 + [
        {"parameters": names.replace("layer150.weight (64, 64)", "layer150.weight (64, 32)")}
    ]
    with pytest.raises(RankDisagreementError) as e:
        agree(FourRanks(fields), "shard_parameters", fields[0], "fix")
    assert "layer150.weight (64, 32)" in str(e.value) and "layer150.weight (64, 64)" in str(e.value)
    assert len(str(e.value)) < 600


def test_values_that_differ_past_what_was_sent_are_not_shown_as_equal():
    head = "x" * 20_000
    fields = [{"extra": head + "a"}] * 3 + [{"extra": head + "b"}]
    runtime = FourRanks(fields)
    runtime.all_process_values = _truncating(runtime.all_process_values)
    with pytest.raises(
        RankDisagreementError, match=r"extra: \(equal in their first 20,000 characters, different after"
    ):
        agree(runtime, "op", fields[0], "fix")


def _truncating(exchange):
    """The exchange as `agree` sends it: texts cut at 20,000 characters."""

    def values(mine, *, same_length=False):
        out = exchange(mine, same_length=same_length)
        if same_length:
            return out
        cut = []
        for v in out:
            call, fields = json.loads(bytes(v).decode())[0]
            cut.append(tuple(json.dumps([[call, {k: t[:20_000] for k, t in fields.items()}]]).encode()))
        return cut

    return values


def test_entries_in_another_order_are_named_as_such():
    fields = [{"parameters": "a.weight (4, 4), b.weight (4,)"}] * 3 + [{"parameters": "b.weight (4,), a.weight (4, 4)"}]
    with pytest.raises(RankDisagreementError, match=r"parameters: \(the same entries in another order\) rank 3"):
        agree(FourRanks(fields), "shard_parameters", fields[0], "fix")


def test_digest_has_a_fixed_size_whatever_the_fields():
    assert len(digest("a", {})) == len(digest("b", {f"f{i}": str(i) for i in range(40)})) == SLOTS
    many = {f"f{i}": "x" for i in range(40)}
    assert digest("a", many) != digest("a", {**many, "f39": "y"})  # fields past the last slot still count


def test_rank_ranges():
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([0, 1, 2]) == "ranks 0-2"
    assert ranks_text([0, 2, 5, 6, 7]) == "ranks 0, 2, 5-7"


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = tmp_path_factory.mktemp("agreement")
    run = warm_launch(WORKER, 4, str(out), "cases", timeout=400)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]


# (case, the error class, what the message must say); rank 3 differs in each, or ranks 2-3.
EXPECTED = {
    "mark_sharding spec": ("RankDisagreementError", r"spec: rank 3 P\('x', None\), ranks 0-2 P\(None, 'x'\)"),
    "mark_sharding mesh order": ("RankDisagreementError", r"mesh: rank 3 mesh\{'x': 4\} ids \[3, 2, 1, 0\], ranks 0-2"),
    "mark_sharding dtype": ("RankDisagreementError", r"dtype: rank 3 float64, ranks 0-2 float32"),
    "mark_sharding shape": ("LocalShapeMismatchError", r"shape: rank 3 \(6, 4\), ranks 0-2 \(8, 4\)"),
    "redistribute": ("RankDisagreementError", r"spec: rank 3 P\(\), ranks 0-2 P\(None, 'x'\)"),
    "distribute_tensor placements": ("RankDisagreementError", r"spec: rank 3 \[R\], ranks 0-2 \[S\(0\)\]"),
    "distribute_module": (
        "RankDisagreementError",
        r"parameters: rank 3 0.weight \(6, 6\).*, ranks 0-2 0.weight \(8, 6\)",
    ),
    "make_global_tensor spec": ("RankDisagreementError", r"spec: rank 3 P\(\), ranks 0-2 P\('x'\)"),
    "make_global_tensor dtype": ("RankDisagreementError", r"dtype: rank 3 int64, ranks 0-2 float32"),
    "make_global_tensor check off": ("RankDisagreementError", r"spec: rank 3 P\(\), ranks 0-2 P\('x'\)"),
    "make_global_tensor shape": ("LocalShapeMismatchError", r"local shape: rank 3 \(3, 5\), ranks 0-2 \(2, 5\)"),
    "make_global_batch keys": ("RankDisagreementError", r"keys: rank 3 \['x'\], ranks 0-2 \['mask', 'x'\]"),
    "different calls": (
        "RankDisagreementError",
        r"^The ranks are in different collective calls: rank 3 make_global_tensor, ranks 0-2 mark_sh",
    ),
    "sampler seed": ("RankDisagreementError", r"seed: rank 3 1, ranks 0-2 0"),
    "loader seed": ("RankDisagreementError", r"seed: rank 3 7, ranks 0-2 0"),
    "loader dataset length": ("RankDisagreementError", r"dataset_size: rank 3 30, ranks 0-2 32"),
    "loader position": ("RankDisagreementError", r"batch: rank 3 2, ranks 0-2 1"),
    "loader drop_last": ("RankDisagreementError", r"drop_last: rank 3 False, ranks 0-2 True"),
    "save_sharded step": ("RankDisagreementError", r"extra: rank 3 \{\"step\": 4\}, ranks 0-2 \{\"step\": 5\}"),
    "load_sharded path": ("RankDisagreementError", r"path: ranks 0-1 \S*ckpt, ranks 2-3 \S*other\."),
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_ranks_that_differ_fail_together_with_the_same_error(cases, case):
    kind, said = EXPECTED[case]
    records = [c[case] for c in cases]
    assert records[0]["error"] == kind, records[0]
    assert re.search(said, records[0]["message"]), records[0]["message"]
    assert re.search("every rank", records[0]["message"], re.IGNORECASE)  # the fix
    for record in records[1:]:  # the same error, word for word, on every rank
        assert (record["error"], record["message"]) == (records[0]["error"], records[0]["message"])
    assert max(r["seconds"] for r in records) < 30


def test_agreeing_ranks_are_not_refused(cases):
    assert cases[0]["agreeing"] == "ok", cases[0]["agreeing"]
