"""The planner's collectives against torch_xla's, for the same FSDP training step of a small
Llama on 8 virtual devices: what the planner plans is what `fsdp_xla` runs.

torch_xla's side is `fsdp_xla.FSDP` (a unit per decoder layer, optimization barriers) with torch's
AdamW, read by `spmd.inspector.capture`; the planner's side is its own lowering
(`spmd.plan.lower.lowering`) and HLO reading (`spmd.plan.compile.program`), in a child process on JAX's 8
virtual CPU devices, the compiler torch_xla uses here, so two programs are compared and not two
compilers. Every gather and gradient reduction is the same on both (the root unit's weights,
embeddings, final norm and head, are gathered once for the step on both); what differs, explained
in docs/plan.md, is the loss's collectives of a few bytes (scalars, label indices), from the two
lowerings of cross-entropy.
"""

import collections
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.torchrun import WORKERS, child_env

pytest.importorskip("torch_xla", reason="compares with the same step compiled through torch_xla (its lane)")

CONFIG = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
BATCH, SEQ, DEVICES = 8, 32, 8
SMALL = 4096  # bytes: the loss's scalars and label indices, below any parameter's gather


def torch_xla_step(xla) -> list:
    """(kind, result bytes, group size, groups) of every collective of one torch_xla FSDP step."""
    import torch_xla
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from fsdp_xla import FSDP, transformer_auto_wrap_policy
    from mesh import Mesh
    from spmd import P, mark_sharding
    from spmd.inspector import capture

    mesh = Mesh(np.arange(DEVICES), (DEVICES,), ("fsdp",))
    torch.manual_seed(0)
    config = LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    model = FSDP(
        LlamaForCausalLM(config), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({LlamaDecoderLayer})
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))
    with capture(ignore=["parameter-all-gather", "replicated-argument"]) as report:
        t = tokens.to(xla)
        mark_sharding(t, mesh, P("fsdp", None))
        model(t, labels=t).loss.backward()
        optimizer.step()
        torch_xla.sync()
    return [(c.kind.value, c.result_bytes, c.group_size, c.num_groups) for g in report.graphs for c in g.collectives]


def planner_step(tmp: Path) -> list:
    config = tmp / "config.json"
    config.write_text(json.dumps(CONFIG))
    worker = WORKERS / "fidelity_worker.py"
    done = subprocess.run(
        [sys.executable, str(worker), str(config), str(BATCH), str(SEQ)],
        env=child_env(xla=False), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return [(r["kind"], r["result_bytes"], len(r["group"]), r["group"]) for r in rows for _ in range(r["count"])]


@pytest.fixture(scope="module")
def steps(xla, tmp_path_factory):
    return torch_xla_step(xla), planner_step(tmp_path_factory.mktemp("fidelity"))


def test_every_collective_spans_the_fsdp_axis(steps):
    theirs, ours = steps
    assert {(size, groups) for _, _, size, groups in theirs} == {(DEVICES, 1)}
    assert {tuple(group) for *_, group in ours} == {tuple(range(DEVICES))}


def test_gathers_and_gradient_reductions_match(steps):
    theirs, ours = steps
    big_theirs = collections.Counter((k, b) for k, b, *_ in theirs if b >= SMALL)
    big_ours = collections.Counter((k, b) for k, b, *_ in ours if b >= SMALL)
    head = CONFIG["vocab_size"] * CONFIG["hidden_size"] * 4  # lm_head.weight, f32
    # Every block weight gathered twice per layer (forward, backward), the root unit's
    # (embeddings, final norm, head) once for the step, and every gradient all-reduced once.
    assert big_theirs == big_ours
    assert big_ours[("all-gather", head)] >= 1 and sum(n for (k, _), n in big_ours.items() if k == "all-reduce") > 0


def test_what_differs_besides_is_a_few_bytes_of_the_loss(steps):
    theirs, ours = steps
    for side in (theirs, ours):
        small = [(k, b) for k, b, *_ in side if b < SMALL]
        assert sum(b for _, b in small) < 4 * SMALL, small
