"""``python -m spmd.inspector``'s flags, checked before anything runs: the flags one lane reads
are refused on the other (never accepted and ignored), and a missing script is named."""

import pytest

from spmd.inspector.cli import build_parser, main

SCRIPT_NEVER_RUN = "raise SystemExit('the script ran: the flags should have been refused first')\n"


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT_NEVER_RUN)
    return path


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--devices", "4"], "--devices"),
        (["--dump-dir", "dumps"], "--dump-dir"),
        (["--threshold", "5"], "--threshold"),
        (["--warmup-steps", "1"], "--warmup-steps"),
        (["--devices", "8", "--warmup-steps", "2"], "--devices, --warmup-steps"),  # the defaults, given
    ],
)
def test_torch_xla_flags_are_refused_with_world(script, tmp_path, capsys, flags, named):
    flags = [str(tmp_path / f) if f == "dumps" else f for f in flags]
    assert main(["--world", "4", *flags, str(script)]) == 2
    err = capsys.readouterr().err
    assert f"{named} only apply to torch_xla's compiled graphs" in err and "leave them out" in err
    assert not (tmp_path / "dumps").exists()


def test_the_flags_after_the_script_are_the_scripts(script):
    """``--devices`` after the script is the script's own flag, not the inspector's."""
    args = build_parser().parse_args(["--world", "2", str(script), "--devices", "4"])
    assert args.devices is None and args.script_args == ["--devices", "4"]


def test_no_script_names_what_to_give(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--world", "4"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "give the script to run" in err and "script_args" not in err
