"""``python -m spmd.inspector --world N``: the dry run from the command line, and its JSON in the
torch_xla lane's schema."""

import json
import subprocess
import sys

import pytest

from spmd.inspector.report import Report
from tests.torchrun import ROOT, child_env

BARE = ROOT / "tests" / "data" / "fully_shard_tp.py"

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12), reason="the DTensor lane (torch 2.15)")


def inspector(*args, cwd=ROOT):
    command = [sys.executable, "-m", "spmd.inspector", *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=child_env(xla=False), capture_output=True, text=True, timeout=600)


def test_the_report_and_its_json_in_both_backends_schema(tmp_path):
    out = tmp_path / "dry.json"
    run = inspector("--world", 8, "--rank", 5, "--json", out, BARE, "--tp", 2)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "== rank 5, step 1: peak" in run.stdout and "all-gather" in run.stdout
    data = json.loads(out.read_text())
    xla = Report(graphs=()).to_dict()
    assert data.keys() == xla.keys() and data["backend"] == "dtensor" and xla["backend"] == "torch_xla"
    assert data["lane"] == data["backend"] and xla["lane"] == xla["backend"]  # the old key, same value
    assert data["steps"][0].keys() == {
        "step",
        "graphs",
        "collectives",
        "bytes_sent_per_device",
        "peak_bytes_per_device",
    }
    assert data["totals"].keys() == xla["totals"].keys()
    (rank,) = data["ranks"]
    assert rank["rank"] == 5 and len(rank["steps"]) == 2
    groups = {tuple(c["ranks"]) for c in rank["steps"][1]["collectives"]}
    assert groups == {(1, 3, 5, 7), (4, 5)}  # rank 5's FSDP (dp) and TP groups of a (4, 2) mesh


def test_a_rank_outside_the_world_is_one_error_line(capsys):
    """The CLI's main in this process: the rank is checked before any rank runs, so a process of
    its own (3 s of imports quiet, 15 s under the suite's load) added nothing; the tests around
    this one start the program."""
    from spmd.inspector.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--world", "4", "--rank", "4", str(BARE)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("error:") == 1 and "--rank 4 is not a rank of --world 4" in err, err


def test_a_failing_script_exits_1_with_a_partial_report(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(BARE.read_text().replace("    dist.destroy_process_group()\n", "    raise KeyError('late')\n"))
    out = tmp_path / "dry.json"
    run = inspector("--world", 4, "--json", out, script, "--steps", 1)
    assert run.returncode == 1
    line = script.read_text().splitlines().index("    raise KeyError('late')") + 1
    assert f"KeyError: 'late' at {script}:{line}" in run.stderr
    data = json.loads(out.read_text())
    assert data["partial"].startswith("rank 0: KeyError") and data["ranks"][0]["steps"]


def test_ranks_worst_names_the_rank_and_peak_of_the_highest_of_all(tmp_path):
    """Uneven shards: 9 rows of a tensor parallel weight over 6 ranks, on a mesh whose coordinate 0
    (the largest shards) is rank 2: ranks 2..5 hold 2 rows, rank 0 one, rank 1 none. ``--ranks
    worst`` runs one rank per set of shard shapes (3 of the 6) and names what ``--ranks all``
    finds by running every rank."""
    script = [ROOT / "tests" / "data" / "tensor_parallel.py", "--hidden", 9, "--d", 256, "--first-rank", 2]
    every, worst = tmp_path / "all.json", tmp_path / "worst.json"
    run_all = inspector("--world", 6, "--ranks", "all", "--json", every, *script)
    run_worst = inspector("--world", 6, "--ranks", "worst", "--json", worst, *script)
    assert run_all.returncode == 0 and run_worst.returncode == 0, run_all.stderr[-2000:] + run_worst.stderr[-2000:]
    peaks = {r["rank"]: max(s["peak_bytes"] for s in r["steps"]) for r in json.loads(every.read_text())["ranks"]}
    assert len(peaks) == 6 and len(set(peaks.values())) == 3  # the ranks differ: the test can tell them apart
    top = max(peaks.values())
    first_top = min(rank for rank, peak in peaks.items() if peak == top)
    (chosen,) = json.loads(worst.read_text())["ranks"]
    assert (chosen["rank"], max(s["peak_bytes"] for s in chosen["steps"])) == (first_top, top) == (2, top)
    assert "(0 | 1 | 2..5)" in run_worst.stdout and "--ranks worst: ran ranks 0, 1, 2;" in run_worst.stdout
