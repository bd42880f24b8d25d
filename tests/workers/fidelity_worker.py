"""Run by test_fidelity.py in its own process: the planner's FSDP step of a small Llama on 8
virtual CPU devices (JAX's), and its collectives, as JSON on stdout.

    python tests/spmd/plan/fidelity_worker.py CONFIG_JSON BATCH SEQ

The planner's own lowering and HLO reading, on the CPU compiler that torch_xla's step in the
test is compiled with, so the two programs are compared, not two compilers.
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import json  # noqa: E402

import numpy as np  # noqa: E402

from mesh import Mesh  # noqa: E402
from spmd.plan._jax_compat import compile_with_hlo  # noqa: E402
from spmd.plan.compile.program import step_collectives  # noqa: E402
from spmd.plan.lower.lowering import TrainStepConfig, lower_train_step  # noqa: E402
from spmd.plan.request.attention import Attention  # noqa: E402
from spmd.plan.request.models import build_meta_model  # noqa: E402
from spmd.plan.request.remat import Remat  # noqa: E402
from spmd.plan.request.specs import param_spec_for  # noqa: E402


def main(config: str, batch: int, seq: int) -> None:
    import jax

    module, hf_config = build_meta_model(config)
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    spec_fn = param_spec_for("fsdp", mesh, hf_config)
    # float32 compute and no checkpointing: the torch_xla step the test compiles.
    step = TrainStepConfig(batch, seq, "float32", Remat.NONE, Attention.DOT, ("fsdp",), ("fsdp",))
    lowered = lower_train_step(module, mesh, np.asarray(jax.devices()), spec_fn, step)
    _, hlo, _ = compile_with_hlo(lowered.lowered)
    out = [
        {"kind": c.kind.value, "result_bytes": c.result_bytes, "group": list(c.group), "count": c.count,
         "bytes_sent": c.bytes_sent_per_device, "op": c.op_name}
        for c in step_collectives(hlo)
    ]  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
