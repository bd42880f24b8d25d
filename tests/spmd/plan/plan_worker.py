"""Run by test_plan.py in its own process: every TPU compile the planner tests need, once.

    python tests/spmd/plan/plan_worker.py OUT_DIR

A subprocess because the test session's XLA_FLAGS (8 virtual CPU devices, the inspector's HLO
dumps) would apply to the TPU compiles too. Writes OUT_DIR/results.json.
"""

import contextlib
import io
import json
import sys
from pathlib import Path

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.experimental.shard_map import shard_map  # noqa: E402
from jax.sharding import Mesh as JaxMesh  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as JP  # noqa: E402

from spmd.plan import plan  # noqa: E402
from spmd.plan.__main__ import main as cli  # noqa: E402
from spmd.plan.program import step_collectives  # noqa: E402

TINY = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}


def main(out: Path) -> None:
    config = out / "tiny_llama.json"
    config.write_text(json.dumps(TINY))
    results: dict = {}

    # The advisor: data parallel, FSDP and 2-D on 4 chips under a 79 MiB budget, through the CLI;
    # then again with --jobs 2 (spawned worker processes), every compile from the cache.
    advise_args = lambda out_name: [  # noqa: E731
        str(config),
        "--topology", "v5e:2x2",
        "--advise",
        "--strategies", "dp,fsdp,2d",
        "--tensors", "2",
        "--per-device-batches", "8",
        "--no-checkpointing",
        "--seq", "128",
        "--hbm-gib", str(79 / 1024),
        "--cache", str(out / "cache"),
        "--json", str(out / out_name),
        "--fsdp-config", str(out / "fsdp_config.json"),
        "--plot", str(out / "advice.png"),
    ]  # fmt: skip
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        results["advise_exit"] = cli(advise_args("advice.json"))
    results["advise_stdout"] = stdout.getvalue()
    with contextlib.redirect_stdout(io.StringIO()):
        results["advise_again_exit"] = cli([*advise_args("advice_again.json"), "--jobs", "2"])

    # Two slices over DCN, 8 chips: data=4 (2 per slice) x fsdp=2, so half the FSDP axis of the
    # one-slice fsdp=4 plan, and a data axis across slices.
    two_slices = plan(str(config), "v5e:2x2", slices=2, mesh={"data": 4, "fsdp": 2}, global_batch=32, seq_len=128)
    results["two_slices"] = two_slices.to_dict()

    # The collectives parser on a program whose collectives are known: 5 all-gathers in a loop, one psum.
    devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices
    mesh = JaxMesh(np.array(devices).reshape(4), ("x",))

    def body(x):
        def step(i, acc):
            return acc + jax.lax.all_gather(x * i, "x", tiled=True)[: x.shape[0]]

        acc = jax.lax.fori_loop(0, 5, step, jnp.zeros_like(x))
        return jax.lax.psum(acc, "x")

    f = jax.jit(shard_map(body, mesh=mesh, in_specs=JP("x", None), out_specs=JP(None, None), check_rep=False))
    arg = jax.ShapeDtypeStruct((4 * 256, 512), jnp.float32, sharding=NamedSharding(mesh, JP("x", None)))
    compiled = f.lower(arg).compile()
    results["loop_collectives"] = [
        {"kind": c.kind.value, "count": c.count, "result_bytes": c.result_bytes, "group_size": c.group_size,
         "bytes_sent_per_device": c.bytes_sent_per_device}
        for c in step_collectives(compiled.as_text())
    ]  # fmt: skip

    (out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":  # --jobs 2 spawns processes that import this module
    main(Path(sys.argv[1]))
