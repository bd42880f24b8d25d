"""A plan on a CPU host starts quietly: none of libtpu's start-up lines (it probes for a TPU host
and reports that there is none) nor transformers' ``loss_type=None`` warning reach the user; a
real failure still shows what libtpu said. Each runs the CLI in a process of its own, where
libtpu loads for the first time, as it does for a user (in the background: child_compile.py)."""

import subprocess
import sys

import pytest

from tests.background import BackgroundRun
from tests.torchrun import ROOT, child_env

# A GPT-2 (the class whose name names no loss, so transformers warned) small enough to compile in seconds.
TINY_GPT2 = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 128,
    "n_head": 2,
    "vocab_size": 512,
    "n_positions": 128,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
# What libtpu 0.0.52 writes while it starts on a host with no TPU, and transformers' warning.
NOISE = (
    "Failed to find host bounds",
    "Logging before InitGoogle",
    "unexpected worker hostname",
    "Source Location Trace",
    "libtpu_init_utils",
    "loss_type",
)


def plan_cli(config: dict | None, *args: str) -> BackgroundRun:
    """``python -m spmd.plan [CONFIG] ARGS...``, a user's command, in a process of its own."""
    return BackgroundRun(("-m", "spmd.plan"), config, *args, timeout=900)


FITS = plan_cli(TINY_GPT2, "--topology", "v5e:2x2", "--batch", "4", "--seq", "128")
REFUSED = plan_cli(None, "gpt2", "--topology", "v5e:3x7")


@pytest.mark.reads(FITS)
def test_a_plan_prints_no_line_of_libtpu_s_start_up():
    done = FITS.completed()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FITS" in done.stdout
    assert done.stderr == "", done.stderr[-3000:]
    assert not [n for n in NOISE if n in done.stdout]


@pytest.mark.reads(REFUSED)
def test_a_topology_libtpu_refuses_shows_libtpu_s_words():
    done = REFUSED.completed()
    assert done.returncode == 2
    assert "error: libtpu refuses the topology 'v5e:3x7'" in done.stderr
    # the start-up lines held while libtpu failed are shown: on this host they include its probing
    assert "Failed to find host bounds" in done.stderr


def test_what_a_held_block_wrote_is_replayed_only_when_it_raises():
    code = (
        "import os, sys\n"
        "from spmd._util.held_stderr import held_stderr\n"
        "with held_stderr():\n"
        "    os.write(2, b'quiet start\\n')\n"
        "print('after', file=sys.stderr)\n"
        "try:\n"
        "    with held_stderr():\n"
        "        os.write(2, b'native words\\n')\n"
        "        raise RuntimeError('boom')\n"
        "except RuntimeError:\n"
        "    print('caught', file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=child_env(xla=False), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "after\nnative words\ncaught\n"
