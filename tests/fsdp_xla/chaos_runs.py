"""test_ft_chaos.py's runs of torchft's healing, in the background: started when collection ends
(tests/conftest.py), awaited by the tests that read their records, which run last.

A heal run is mostly waiting: 2 x 2 ranks step at most every `STEP_SECONDS` while a group heals,
0.7 of the machine's 2 cores for 90 s measured alone, and 85 s of the suite's wall time when its
tests ran it in the foreground. The runs keep the tests' own priority (not the compiles' nice 19):
the tests bound how long a heal takes.
"""

import functools
import importlib.util
import shutil
import tempfile
from pathlib import Path

from tests.background import BackgroundRun
from tests.torchrun import WORKERS

HEAL_STEPS = 115
STEP_SECONDS = 0.6  # a restart costs seconds of imports: the live group must still be training after it
# Each run (tests/workers/chaos_worker.py) and the tests of test_ft_chaos.py that read it:
# collecting any of them starts the run.
READERS = {
    "heal": (
        "test_one_kill_is_healed_without_restarting_the_job",
        "test_the_groups_hold_the_same_weights_at_every_step_both_commit",
        "test_the_losses_are_the_failure_free_runs",
    ),
    "fallback": ("test_checkpoints_stay_the_fallback_when_every_group_is_lost",),
}
TIMEOUT_SECONDS = 600  # each run bounds its groups' torchruns to 170 s; the fallback has two
_runs: dict[str, BackgroundRun] = {}
_out: list[str] = []  # the runs' shared output directory, once made


@functools.cache
def _torchft_installed() -> bool:  # without it test_ft_chaos.py skips its tests
    return importlib.util.find_spec("torchft") is not None


def needed(nodeids: list[str]) -> list[str]:
    """The runs the tests ``nodeids`` read."""
    if not _torchft_installed():
        return []
    return [
        part
        for part, tests in READERS.items()
        if any(f"fsdp_xla/test_ft_chaos.py::{test}" in nodeid for nodeid in nodeids for test in tests)
    ]


def start(parts: list[str]) -> None:
    """The runs ``parts``, at once, at the tests' priority; `tests.background.stop_all` ends them."""
    for part in parts:
        if not _out:
            _out.append(tempfile.mkdtemp(prefix="chaos-runs-"))
        if part not in _runs:
            worker = (str(WORKERS / "chaos_worker.py"),)
            _runs[part] = BackgroundRun(worker, None, _out[0], part, timeout=TIMEOUT_SECONDS, nice=False)
            _runs[part].start()


def records_dir(part: str) -> tuple[Path, list[dict]]:
    """Where ``part``'s ranks wrote their records, and its kills (waits for the run; starts it
    first when the session did not)."""
    start([part])
    return Path(_out[0]) / part, _runs[part].result()["kills"]


def remove_output() -> None:
    """Remove the runs' records (after tests.background.stop_all has ended them)."""
    for out in _out:
        shutil.rmtree(out, ignore_errors=True)
    _out.clear()
    _runs.clear()
