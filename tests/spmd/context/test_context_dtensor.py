"""Context parallelism on the dtensor backend (4 gloo ranks, one torchrun job:
tests/workers/context_worker.py): each rank's attention of its tokens, and its gradients, equal
the whole sequence's in float64, on a context-only and an fsdp x context mesh, load-balanced or
not, causal or not, with grouped-query heads; and the refusals name the cause and the fix."""

import json
import re

import pytest

from tests.torchrun import WORKERS, warm_launch

WORKER = WORKERS / "context_worker.py"


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("context")
    run = warm_launch(WORKER, 4, str(out), timeout=400)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]


def test_every_rank_computes_the_whole_sequence_s_attention_for_its_tokens(records):
    cases = [c for c in records[0] if "=" in c or c.startswith("multi-head")]
    assert len(cases) == 9
    for record in records:
        for case in cases:
            *errors, same_shape_after_remove = record[case]
            assert max(errors) < 1e-12, (case, errors)  # output, dq, dk, dv, the unsharded output
            assert same_shape_after_remove == 1


def test_a_transformers_llama_computes_its_logits_and_gradients_as_without_cp(records):
    for record in records:
        logits, grads, switched_and_restored = record["transformers llama"]
        assert logits < 1e-12 and grads < 1e-12, record["transformers llama"]
        assert switched_and_restored == 1


EXPECTED = {
    "explicit mask": (
        "UnsupportedAttentionError",
        r"inner \(Attention\) calls scaled_dot_product_attention with an explicit attn_mask \(shape \(8, 8\)\).*is_causal=True",
    ),
    "odd sequence": (
        "SequenceLengthError",
        r"12 tokens cannot be split over 4 context shards.*Pad it to a multiple of 8",
    ),
    "no context axis": (
        "UnknownAxisError",
        r"mesh axis 'context', but mesh\{'fsdp': 4\}.*ParallelDims\(fsdp=2, context=2\)",
    ),
    "unknown strategy": ("ContextParallelError", r"strategy 'ulysses' is not one of \('all_gather',\)"),
    "already laid out": (
        "ContextParallelError",
        r"input_ids is already laid out \(a DTensor with placements \[Shard\(dim=1\)\]\)",
    ),
    "ragged batch": (
        "ContextParallelError",
        r"differ in rows or sequence length: \{'input_ids': \(4, 16\), 'labels': \(4, 8\)\}",
    ),
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_wrong_input_is_refused_on_every_rank_with_the_fix(records, case):
    kind, said = EXPECTED[case]
    for record in records:
        assert record[case]["error"] == kind, record[case]
        assert re.search(said, record[case]["message"]), record[case]["message"]
