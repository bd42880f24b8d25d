"""The blog's snippets and examples/train_spmd.py run and train; sharded equals unsharded."""

import numpy as np
import torch
import torch.nn.functional as F

from mesh import Mesh
from tests.fsdp_xla.helpers import load_example as load


def test_blog_snippets(xla):
    blog = load("blog_snippets")
    mesh = blog.mesh_section()
    assert mesh.get_logical_mesh().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    view = blog.partition_spec_section()
    assert view.sharding_spec == "{devices=[2,2,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}"
    losses = blog.simple_example()
    assert np.mean(losses[-5:]) < 0.5 * losses[0]


def test_train_spmd_loss_falls(xla):
    losses = load("train_spmd").main(["--steps", "15"])
    assert len(losses) == 15
    assert losses[-1] < 0.8 * losses[0]


def test_sharded_gpt_step_matches_single_device(xla):
    train = load("train_spmd")
    torch.manual_seed(0)
    cpu_model = train.TinyGPT()
    model = train.TinyGPT().to(xla)
    model.load_state_dict(cpu_model.state_dict())
    train.shard_model(model, Mesh(np.arange(8), (4, 2), ("data", "model")))
    tokens = train.synthetic_batch(torch.Generator().manual_seed(1), 8, 32, 64)

    def loss_and_grad(m, toks):
        logits = m(toks[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 64), toks[:, 1:].reshape(-1))
        loss.backward()
        return loss, m.blocks[0].qkv.weight.grad

    ref_loss, ref_grad = loss_and_grad(cpu_model, tokens)
    loss, grad = loss_and_grad(model, tokens.to(xla))
    torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.cpu(), ref_grad, rtol=1e-4, atol=1e-5)


def test_train_fsdp_runs_all_features_and_loss_falls(xla):
    losses = load("train_fsdp").main(["--steps", "8", "--bf16", "--checkpointing", "--deferred-init", "--lr", "1e-2"])
    assert len(losses) == 8
    assert losses[-1] < 0.9 * losses[0]


def test_hf_trainer_example_with_the_blog_config(xla, tmp_path):
    out = load("hf_trainer_fsdp").main(["--steps", "6", "--output-dir", str(tmp_path)])
    assert out["losses"][-1] < out["losses"][0]
    assert out["units"][0] == "" and len(out["units"]) == 5


def test_train_fsdp_runs_on_the_dtensor_backend_under_torchrun(tmp_path):
    from pathlib import Path

    from tests.torchrun import torchrun

    script = Path(__file__).resolve().parents[1] / "examples" / "train_fsdp.py"
    run = torchrun(script, 4, "--backend", "dtensor", "--steps", "8", "--deferred-init", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "devices: 4 processes (gloo), mesh: {'fsdp': 4}" in run.stdout
    losses = [float(line.split("loss")[1].split()[0]) for line in run.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 3 and losses[-1] < losses[0]
