"""Run in subprocesses by test_checkpoint_safety.py (host tensors, no XLA runtime needed).

python checkpoint_race_worker.py save_loop ROOT SEED COUNT   # COUNT saves into ROOT, keep=1
python checkpoint_race_worker.py full_disk ROOT              # a save that hits RLIMIT_FSIZE
python checkpoint_race_worker.py slow_load ROOT              # load, pausing inside the read
"""

import json
import resource
import signal
import sys
import time
from pathlib import Path

import torch

import fsdp_xla.checkpoint as ck
from fsdp_xla import CheckpointError


def model(seed: int, big: bool = False) -> torch.nn.Module:
    """The test's model; ``big`` (160 KiB of weights) is larger than the file size limit."""
    torch.manual_seed(seed)
    width = 256 if big else 16
    return torch.nn.Sequential(torch.nn.Linear(8 * (16 if big else 1), width), torch.nn.Linear(width, 4))


action, root = sys.argv[1], Path(sys.argv[2])
if action == "save_loop":
    seed, count = int(sys.argv[3]), int(sys.argv[4])
    m = model(seed)
    for i in range(count):
        with torch.no_grad():
            m[0].bias.fill_(seed * 1000 + i)  # which process and which save wrote it
        ck.save_sharded(root, m, extra={"seed": seed, "i": i})
    print("DONE", flush=True)
elif action == "full_disk":
    first = model(0, big=True)
    ck.save_sharded(root, first, extra={"which": "first"})
    latest = (root / "LATEST").read_text()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    try:
        ck.save_sharded(root, model(1, big=True), extra={"which": "second"})
        outcome = "saved"
    except CheckpointError as e:
        outcome = f"CheckpointError: {e}"
    except BaseException as e:  # noqa: BLE001 - reported to the test
        outcome = f"{type(e).__name__}: {e}"
    loaded = model(2, big=True)
    extra = ck.load_sharded(root, loaded)
    same = all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), loaded.state_dict().values()))
    print(
        json.dumps(
            {
                "outcome": outcome,
                "latest_unchanged": (root / "LATEST").read_text() == latest,
                "entries": sorted(p.name for p in root.iterdir()),
                "extra": extra,
                "weights_of_first": same,
            }
        ),
        flush=True,
    )
elif action == "slow_load":
    read = ck._files.Reader.block
    paused = []

    def slow(self, file, name):
        if not paused:  # the first block read holds the version for 3 s
            paused.append(name)
            print("READING", flush=True)
            time.sleep(3)
        return read(self, file, name)

    ck._files.Reader.block = slow
    m = model(3)
    extra = ck.load_sharded(root, m)
    print("LOADED", json.dumps(extra), flush=True)
