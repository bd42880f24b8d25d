"""The one script runner both lanes run scripts through: argv and sys.path as ``python SCRIPT``
gives them, one stop signal, and how a script ended (finished, stopped, exited, raised)."""

import sys
from contextlib import contextmanager

import pytest

from spmd.inspector._runner import ScriptEnd, StopScript, run_script


def script(tmp_path, body):
    path = tmp_path / "train.py"
    path.write_text(body)
    return path


def test_the_script_runs_as_main_with_its_argv_and_folder(tmp_path):
    path = script(tmp_path, "import sys\nassert __name__ == '__main__'\nRESULT.append((sys.argv, sys.path[0]))\n")
    seen = []
    sys.modules["builtins"].RESULT = seen
    try:
        argv, path0 = sys.argv, list(sys.path)
        assert run_script(path, ["--steps", "2"]) == ScriptEnd()
        assert (sys.argv, sys.path) == (argv, path0)  # put back
    finally:
        del sys.modules["builtins"].RESULT
    assert seen == [([str(path), "--steps", "2"], str(tmp_path.resolve()))]


def test_a_stopped_script_and_exit_0_are_finished(tmp_path):
    assert (
        run_script(script(tmp_path, "from spmd.inspector._runner import StopScript\nraise StopScript\n"), [])
        == ScriptEnd()
    )
    assert run_script(script(tmp_path, "import sys\nsys.exit(0)\n"), []) == ScriptEnd()


def test_exit_n_and_an_exception_are_failures_with_their_exit_codes(tmp_path):
    exited = run_script(script(tmp_path, "import sys\nsys.exit(3)\n"), [])
    assert (exited.exit_code, exited.failure, exited.traceback) == (3, "the script exited with code 3", "")
    raised = run_script(script(tmp_path, "x = 1\nraise KeyError('late')\n"), [])
    assert raised.exit_code == 1 and raised.describe() == f"KeyError: 'late' at {tmp_path / 'train.py'}:2"
    assert raised.traceback.startswith("Traceback") and "_runner.py" not in raised.traceback  # the script's frames


def test_the_capture_sees_the_scripts_error_and_its_own_errors_propagate(tmp_path):
    seen = []

    @contextmanager
    def capture(fail_at_exit=False):
        try:
            yield
        except BaseException as e:
            seen.append(type(e).__name__)
            raise
        if fail_at_exit:
            raise RuntimeError("nothing to report")

    assert run_script(script(tmp_path, "raise ValueError('boom')\n"), [], capture()).exit_code == 1
    assert seen == ["ValueError"]  # what marks a report partial
    with pytest.raises(RuntimeError, match="nothing to report"):
        run_script(script(tmp_path, "pass\n"), [], capture(fail_at_exit=True))


def test_stop_script_is_not_an_exception_a_script_catches():
    assert not issubclass(StopScript, Exception)


@pytest.mark.parametrize("code,exit_code", [(0, 1), (4, 4)])
def test_os_exit_ends_the_script_not_the_inspector(tmp_path, code, exit_code):
    """``os._exit`` would end the inspector's process with no report (and exit 0): the script
    stops there, and the run is a failure that names the call, its line and the fix."""
    path = script(tmp_path, f"import os\nRAN = 1\nos._exit({code})\nraise AssertionError('ran past os._exit')\n")
    end = run_script(path, [])
    assert end.exit_code == exit_code and end.line == f"{path}:3"
    assert end.failure.startswith(f"os._exit({code}) ended the script") and "return, or sys.exit" in end.failure
    import os

    assert os._exit.__module__ == "posix"  # put back


def test_a_forked_child_still_exits_for_real(tmp_path):
    """A data loader's worker is a fork of the inspector: its ``os._exit`` must end it."""
    body = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(7)\n_, status = os.waitpid(pid, 0)\nassert os.waitstatus_to_exitcode(status) == 7\n"
    assert run_script(script(tmp_path, body), []) == ScriptEnd()


def test_a_thread_that_dies_fails_the_run(tmp_path):
    """Python prints a thread's exception and goes on; the run would end as if it were fine."""
    body = (
        "import threading\n"
        "def train():\n"
        "    raise KeyError('lost')\n"
        "t = threading.Thread(target=train, name='trainer')\n"
        "t.start()\n"
        "t.join()\n"
    )
    path = script(tmp_path, body)
    import threading

    hook = threading.excepthook
    end = run_script(path, [])
    assert end.exit_code == 1 and end.line == f"{path}:3"
    assert end.failure == "a thread of the script (trainer) died with KeyError: 'lost'"
    assert threading.excepthook is hook  # put back


@pytest.mark.parametrize("body", ["def f(:\n", "x = 1\x00\n"], ids=["syntax-error", "null-byte"])
def test_a_script_that_does_not_compile_names_its_line_not_the_runner(tmp_path, body):
    path = script(tmp_path, body)
    end = run_script(path, [])
    assert end.exit_code == 1 and end.failure.startswith("the script does not compile: SyntaxError: ")
    assert "_runner.py" not in end.traceback and "runpy" not in end.traceback
    assert end.line == (f"{path}:1" if "(" in body else "")


def test_exit_with_a_message_is_exit_code_1_with_the_message(tmp_path):
    end = run_script(script(tmp_path, "import sys\nsys.exit('bye')\n"), [])
    assert end == ScriptEnd(1, "the script exited with the message 'bye' (exit code 1)")
