"""The advisor's second pass without a compiler (`spmd.plan.advisor.refine`): a preset as
per-tensor choices plans and recomputes as the preset does, the neighbours are one tensor away,
and which of them are searched, at which batches, given the ceilings and the limit."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spmd.plan.advisor.advice import Candidate, Outcome
from spmd.plan.advisor.refine import block_names, neighbours, refinement, remat_text
from spmd.plan.advisor.search import MeshSearch
from spmd.plan.errors import PlanError
from spmd.plan.predict.ceiling import recompute_floor
from spmd.plan.predict.memory import model_shape, saved_per_token
from spmd.plan.request.attention import Attention
from spmd.plan.request.custom_remat import BLOCK_INPUT_NAME, CHOICES, NAMES, CustomRemat
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.remat import Remat, as_custom
from tests.spmd.plan.child_compile import on_demand_on_torch_xla

GIB = 2**30
LLAMA = ("decoder_layer_input", "context", "query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1",
         "mlpwo")  # fmt: skip


@pytest.fixture(scope="module")
def llama():
    module, config = build_meta_model("llama3.1-8b")
    return module, model_shape(config, sum(p.numel() for p in module.parameters()))


def test_a_block_names_what_its_model_produces():
    module, _ = build_meta_model("llama3.1-8b")
    assert block_names(module, splash=True) == LLAMA
    assert block_names(module, splash=False) == tuple(n for n in LLAMA if n != "context")  # no kernel residuals
    gpt2, _ = build_meta_model("gpt2")
    assert block_names(gpt2, splash=False) == ("decoder_layer_input", "qkv_proj", "out_proj", "mlpwi", "mlpwo")


PRESETS = [r for r in Remat if r is not Remat.NONE]


@pytest.mark.parametrize("preset", PRESETS, ids=lambda r: r.value)
@pytest.mark.parametrize("attention", list(Attention), ids=lambda a: a.value)
def test_a_preset_as_per_tensor_choices_keeps_and_recomputes_what_the_preset_does(llama, preset, attention):
    module, shape = llama
    custom = as_custom(preset.value, block_names(module, attention is Attention.FLASH))
    assert isinstance(custom, CustomRemat)
    assert saved_per_token(shape, custom, attention, 8192) == pytest.approx(
        saved_per_token(shape, preset, attention, 8192)
    )
    # with dot attention there are no kernel residuals to keep: save_qkv_context keeps what
    # save_qkv_proj keeps (spmd.plan.request.remat), and recomputes as it does
    same = Remat.SAVE_QKV_PROJ if (preset, attention) == (Remat.SAVE_QKV_CONTEXT, Attention.DOT) else preset
    assert recompute_floor(shape, custom, 8192) == pytest.approx(recompute_floor(shape, same, 8192))


def test_the_presets_as_choices_read_as_maxtext_writes_them():
    assert as_custom("offload", LLAMA).value == "custom:decoder_layer_input=offload"
    assert as_custom("full", LLAMA) == CustomRemat(()) and remat_text(CustomRemat(())) == "full"
    assert as_custom("save_qkv_context", LLAMA).value == (
        "custom:context=device,query_proj=device,key_proj=device,value_proj=device"
    )
    assert as_custom("none", LLAMA) is None  # keeps every activation: no per-tensor policy says so
    given = "custom:decoder_layer_input=offload,out_proj=offload"
    assert as_custom(given, LLAMA) == CustomRemat.parse(given)
    with pytest.raises(PlanError, match="remat must be one of"):
        as_custom("sometimes", LLAMA)


choice_sets = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(CHOICES)), max_size=6).map(dict)


@given(choice_sets)
def test_each_neighbour_differs_in_one_tensor_and_every_such_policy_is_one(choices):
    policy = CustomRemat(tuple((n, choices[n]) for n in NAMES if choices.get(n, "remat") != "remat"))
    found = neighbours(policy, LLAMA)
    before = dict(policy.choices)
    state = lambda d, n: d.get(n, "remat") if n != BLOCK_INPUT_NAME else d.get(n) == "offload"  # noqa: E731
    for n in found:
        after = dict(n.choices)
        changed = [name for name in NAMES if state(before, name) != state(after, name)]
        assert len(changed) == 1 and changed[0] in LLAMA
    # the block's input has two states (on the device, or the host), every other tensor three
    assert len(found) == len(set(found)) == 1 + 2 * (len(LLAMA) - 1)


# -- which neighbours are searched -----------------------------------------------------------


class Report:
    """The part of a PlanReport the search reads."""

    def __init__(self, fits, mfu):
        self.fits, self.mfu = fits, mfu


def _winner(remat="save_qkv_context", batch=2, mfu=0.50):
    return Outcome(Candidate("fsdp", (("fsdp", 64),), batch, remat), Report(True, mfu))


def _search(predict=lambda remat, batch: None):
    return MeshSearch("fsdp", (("fsdp", 64),), (1, 2, 4, 8), ("save_qkv_context",), 90 * GIB, predict)


def test_the_neighbours_are_searched_at_the_winners_batch_and_the_next_one_up_highest_ceiling_first():
    near = neighbours(as_custom("save_qkv_context", LLAMA), LLAMA)
    ceilings = {remat_text(n): 0.9 - 0.01 * k for k, n in enumerate(near)}
    plan = refinement(_winner(), _search(), LLAMA, (1, 2, 4, 8), ceilings.get, limit=3, floor_holds=True)
    assert [s.remats for s in plan.searches] == [(v,) for v in list(ceilings)[:3]]
    assert all(s.batches == (2, 4) and s.mesh == (("fsdp", 64),) for s in plan.searches)
    assert len(plan.skipped) == len(ceilings) - 3
    assert all("beyond the 3 with the highest ceilings" in o.skipped for o in plan.skipped)


def test_a_neighbour_whose_ceiling_is_below_the_winner_is_not_compiled_once_the_floor_holds():
    names = ("decoder_layer_input", "query_proj")
    policy = as_custom("save_qkv_context", names)  # q kept on the device
    low = {remat_text(n): 0.45 for n in neighbours(policy, names)}  # below the winner's 50 %
    low["custom:decoder_layer_input=offload,query_proj=device"] = 0.55
    plan = refinement(_winner(), _search(), names, (1, 2, 4), low.get, limit=4, floor_holds=True)
    assert [s.remats for s in plan.searches] == [("custom:decoder_layer_input=offload,query_proj=device",)]
    assert all(
        o.skipped.startswith("not compiled: cannot win: its predicted MFU is at most 45.0 %") for o in plan.skipped
    )
    # where the winner's predicted program misses matmuls, no ceiling rules a neighbour out
    unsure = refinement(_winner(), _search(), names, (1, 2, 4), low.get, limit=4, floor_holds=False)
    assert len(unsure.searches) == 3 and not unsure.skipped


def test_a_winner_that_keeps_everything_or_a_limit_of_zero_searches_nothing():
    assert refinement(_winner("none"), _search(), LLAMA, (1, 2), lambda r: 0.9, 4, True).searches == ()
    assert refinement(_winner(), _search(), LLAMA, (1, 2), lambda r: 0.9, 0, True).searches == ()


def test_a_neighbour_our_memory_math_rules_out_is_listed_not_compiled():
    names = ("decoder_layer_input", "query_proj")
    # every batch of a policy that keeps q on the device is over the budget by our math
    math = lambda remat, batch: _Math(200 * GIB if "query_proj=device" in remat else GIB)  # noqa: E731
    plan = refinement(_winner(batch=1), _search(math), names, (1, 2), lambda r: 0.9, 4, True)
    compiled = []
    for search in plan.searches:
        while (c := search.next()) is not None:
            compiled.append((c.remat, c.per_device_batch))
            search.record(Outcome(c, Report(True, 0.6)))
    assert all("query_proj=device" not in r for r, _ in compiled) and compiled
    ruled_out = [o for s in plan.searches for o in s.outcomes if o.report is None]
    assert ruled_out and all("query_proj=device" in o.candidate.remat for o in ruled_out)


class _Math:
    def __init__(self, total):
        self.total = total

    def describe(self):
        return f"{self.total / GIB:.2f} GiB/device"


# -- through the CLI, compiled (plan_worker.py's refined_advice section) ---------------------


@pytest.fixture(scope="module")
def refined():
    from tests.spmd.plan import plan_results

    return plan_results.results()[0]["refined"]


@on_demand_on_torch_xla
def test_the_cli_searches_the_winner_s_per_tensor_variants_after_the_presets(refined):
    assert refined["exit"] == 0, refined["stderr"][-2000:]
    advice = refined["advice"]
    presets = [o for o in advice["outcomes"] if o["remat"] == "full" and o["report"]]
    assert presets and all(o["report"]["fits"] for o in presets)
    first = max(presets, key=lambda o: o["report"]["estimate"]["predicted_mfu"])
    variants = [o for o in advice["outcomes"] if o["remat"] != "full"]
    # full keeps only the block's input: each of the tiny Llama's 7 projections kept on the device
    # or offloaded, or the input offloaded, is one tensor away: 15 variants, 1 searched (--refine 1;
    # their ceilings tie, none keeps all of q, k and v: the first in MaxText's name order, the input)
    assert len({o["remat"] for o in variants}) == 15
    searched = {o["remat"] for o in variants if o["report"]}
    assert searched == {"custom:decoder_layer_input=offload"}
    skipped = [o for o in variants if not o["report"]]
    assert all("per-tensor variants beyond the 1 with the highest ceilings" in o["skipped"] for o in skipped)
    assert len(skipped) == 14
    for o in variants:  # on the winner's mesh, at its batch or the next one up
        assert o["mesh"] == first["mesh"] and o["per_device_batch"] in (first["per_device_batch"], 4)
        if o["report"]:
            assert o["report"]["remat"] == o["remat"]  # each compiled with the policy it names
    assert (
        f"per-tensor remat near the winner (fsdp=4 · batch {first['per_device_batch']} · remat full)"
        in (refined["stderr"])
    )
    # one ranking: the plans that fit by predicted MFU, whichever pass found them
    fitting = [
        o["report"]["estimate"]["predicted_mfu"] for o in advice["outcomes"] if o["report"] and o["report"]["fits"]
    ]
    assert fitting == sorted(fitting, reverse=True)
    compile(advice["code"], "advice", "exec")


@on_demand_on_torch_xla
def test_a_second_refined_advice_compiles_nothing(refined):
    assert refined["again_exit"] == 0
    again = refined["again"]["outcomes"]
    assert [o["cached"] for o in again if o["report"]] == [True] * sum(1 for o in again if o["report"])
    assert [o["remat"] for o in again] == [o["remat"] for o in refined["advice"]["outcomes"]]


@pytest.mark.parametrize("refine", [-1, 65, 2.5, "4", True])
def test_a_refine_that_is_not_a_count_is_refused_before_anything_compiles(refine):
    from spmd.plan import advise

    with pytest.raises(PlanError, match="refine must be a whole number from 0 to 64"):
        advise("gpt2", "v5e:2x2", refine=refine)


def test_the_cli_refuses_refine_without_advise_and_out_of_range(capsys):
    from spmd.plan.__main__ import main

    for args, message in (
        (["--refine", "2"], "--refine only steers the advisor's search"),
        (["--advise", "--refine", "65"], "--refine: 65 is out of range"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(["gpt2", "--topology", "v5e:2x2", *args])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_neighbour_that_is_a_preset_the_first_pass_searched_is_not_searched_again():
    # GPT-2's block under save_qkv_proj keeps its fused q/k/v: computing it again keeps nothing, `full`
    names = ("decoder_layer_input", "qkv_proj", "out_proj", "mlpwi", "mlpwo")
    first = MeshSearch("fsdp", (("fsdp", 64),), (1, 2), ("save_qkv_proj", "full"), 90 * GIB, lambda r, b: None)
    plan = refinement(_winner("save_qkv_proj"), first, names, (1, 2), lambda r: 0.9, 64, True)
    tried = [s.remats[0] for s in plan.searches]
    assert "full" not in tried and "custom:qkv_proj=offload" in tried
    assert len(tried) == len(neighbours(as_custom("save_qkv_proj", names), names)) - 1
