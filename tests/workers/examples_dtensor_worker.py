"""Run under torchrun by test_examples.py: the examples on the dtensor backend, one launch.

    torchrun --nproc_per_node 4 tests/examples_dtensor_worker.py OUT_DIR

examples/train_fsdp.py and examples/train_spmd.py with no ``--backend`` (under torchrun the
default is dtensor; train_spmd on a (2, 2) data x model mesh), train_spmd's model trained
eagerly in one process on the same data as the reference, examples/mfu_benchmark.py on a
one-block GPT-2 (fsdp against FSDP2's fully_shard), and examples/one_script.py. Rank 0 writes
results.json (and the benchmark's mfu.json) into OUT_DIR.
"""

import json
import sys
from pathlib import Path

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from examples import mfu_benchmark, one_script, train_fsdp, train_spmd  # noqa: E402

dist.init_process_group("gloo")
out = Path(sys.argv[1])
steps = 6

small = ["--layers", "2", "--d-model", "64", "--seq", "32", "--batch", "8"]
fsdp_losses = train_fsdp.main([*small, "--steps", "8", "--deferred-init", "--checkpointing"])
spmd_losses = train_spmd.main(["--steps", str(steps)])

torch.manual_seed(0)  # as train_spmd.main: the same initial weights and batches, one process
eager = train_spmd.TinyGPT()
optimizer = torch.optim.AdamW(eager.parameters(), lr=3e-3)
gen = torch.Generator().manual_seed(0)
eager_losses = []
for _ in range(steps):
    tokens = train_spmd.synthetic_batch(gen, 16, 32, 64)
    logits = eager(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    eager_losses.append(loss.item())

config = out / "gpt2_one_block.json"
if dist.get_rank() == 0:
    config.write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 4, "vocab_size": 512}))
dist.barrier()
bench_args = ["--config", str(config), "--batch", "8", "--seq", "32"]  # fsdp and the fully_shard baseline
bench = mfu_benchmark.main([*bench_args, "--steps", "2", "--warmup", "1", "--json", str(out / "mfu.json")])
one_losses = one_script.main(["--steps", "5"])  # DTensor's vocabulary; also run on torch_xla by the test

if dist.get_rank() == 0:
    result = {"fsdp_losses": fsdp_losses, "spmd_losses": spmd_losses, "spmd_eager_losses": eager_losses}
    result["one_script_losses"] = one_losses
    result["torch_xla_imported"] = "torch_xla" in sys.modules
    (out / "results.json").write_text(json.dumps(result))
dist.destroy_process_group()
