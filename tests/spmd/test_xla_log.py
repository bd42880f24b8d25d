"""The stderr filter prints a repeated XLA notice once and every other line as it came."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, sys
from spmd.xla_log import show_repeated_notices_once
show_repeated_notices_once()
for i in range(3):
    os.write(2, b"W sharding_propagation.cc] GSPMD sharding propagation is going to be deprecated x\\n")
    os.write(2, f"real warning {i}\\n".encode())
print("stdout untouched")
raise ValueError("boom")
"""


def test_repeated_notice_once_everything_else_kept():
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT)}
    )
    assert run.returncode == 1
    assert run.stderr.rstrip().endswith("ValueError: boom")  # the traceback gets through
    assert run.stdout == "stdout untouched\n"
    lines = run.stderr.splitlines()
    assert sum("going to be deprecated" in line for line in lines) == 1
    assert [line for line in lines if line.startswith("real warning")] == [f"real warning {i}" for i in range(3)]
