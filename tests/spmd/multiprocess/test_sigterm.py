"""SigtermHold: a SIGTERM that comes while a collective failure is on its way or diagnosed waits
until the report is raised and a grace after it; any other SIGTERM acts at once; the previous
handler is back after the block. Each case runs in a child process that signals itself. (Under
torchrun, with real gloo failures: tests/test_multiprocess.py.)"""

import subprocess
import sys

import pytest

from spmd.multiprocess import _sigterm
from tests.torchrun import child_env

# A rank's block: a "collective" fails (KeyError stands for gloo's error), the failure is
# diagnosed for 0.2 s, the report is raised and handled by the caller, which then goes on.
CHILD = """
import importlib.util, os, signal, sys, time

# By its path: the module needs nothing of the package, and importing spmd costs seconds (torch).
spec = importlib.util.spec_from_file_location("_sigterm", sys.argv[2])
_sigterm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_sigterm)

_sigterm.REPORT_GRACE = 0.5
mode = sys.argv[1]
if mode == "user handler":
    signal.signal(signal.SIGTERM, lambda signum, frame: print("user handler", flush=True))
previous = signal.getsignal(signal.SIGTERM)
hold = _sigterm.SigtermHold(lambda e: isinstance(e, KeyError), lambda: print("last beat", flush=True))
try:
    with hold:
        try:
            if mode == "idle":
                os.kill(os.getpid(), signal.SIGTERM)
                print("went on", flush=True)
            raise KeyError("the collective failed")
        except KeyError as e:
            if mode in ("in flight", "user handler", "replaced"):  # before this rank knows it will diagnose
                os.kill(os.getpid(), signal.SIGTERM)
            hold.diagnosing()
            if mode == "diagnosing":
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            raise RuntimeError("the report") from e
except RuntimeError as e:
    print("reported:", e, flush=True)
    if mode == "replaced":  # the caller's own handler, installed after the report, gets the held SIGTERM
        previous = lambda signum, frame: print("caller's handler", flush=True)
        signal.signal(signal.SIGTERM, previous)
for _ in range(12):  # the caller goes on; the held SIGTERM comes after the grace (0.5 s)
    time.sleep(0.1)
print("went on, handler restored:", signal.getsignal(signal.SIGTERM) is previous, flush=True)
"""


def run(mode: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, _sigterm.__file__],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stderr == "", done.stderr
    return done.returncode, done.stdout.splitlines()


@pytest.mark.parametrize("mode", ["in flight", "diagnosing"])
def test_a_sigterm_during_a_failure_waits_for_the_report_and_the_grace(mode):
    code, lines = run(mode)
    assert lines == ["reported: the report", "last beat"]  # then the default action: no "went on"
    assert code == -15


def test_a_sigterm_with_no_failure_in_flight_acts_at_once():
    code, lines = run("idle")
    assert lines == ["last beat"]
    assert code == -15


def test_without_a_sigterm_the_previous_handler_is_back_after_the_grace():
    code, lines = run("none")
    assert lines == ["reported: the report", "went on, handler restored: True"]
    assert code == 0


def test_a_handler_of_the_user_s_gets_the_held_sigterm_after_the_report():
    code, lines = run("user handler")
    assert lines == ["reported: the report", "user handler", "went on, handler restored: True"]
    assert code == 0


def test_a_handler_installed_during_the_grace_gets_the_held_sigterm():
    code, lines = run("replaced")
    assert lines == ["reported: the report", "caller's handler", "went on, handler restored: True"]
    assert code == 0
