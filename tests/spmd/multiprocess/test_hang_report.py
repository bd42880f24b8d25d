"""watch_collectives turns only the process group's own collective timeout into
CollectiveTimeoutError; any other error passes through unchanged. (A real gloo timeout, with a
SIGSTOPped rank: tests/test_multiprocess.py.)"""

import pytest

from spmd import CollectiveTimeoutError, watch_collectives
from spmd.multiprocess._hang_report import is_collective_failure

# gloo's text for a collective timeout, as torch 2.9 and 2.15 raise it (a plain RuntimeError).
GLOO_TIMEOUT = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv "
    "operation to complete"
)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly: timed out after 5 s"),
        RuntimeError("my own step timed out"),
        RuntimeError("Timed out waiting 3000ms for recv operation to complete"),  # without gloo's location
        TimeoutError("timed out"),
        ValueError("timeout"),
    ],
)
def test_any_other_error_passes_through_unchanged(error):
    with pytest.raises(type(error)) as raised:
        with watch_collectives("step 3"):
            raise error
    assert raised.value is error and raised.type is type(error) and str(raised.value) == str(error)


def test_the_process_group_s_own_timeout_is_a_collective_timeout():
    assert is_collective_failure(RuntimeError(GLOO_TIMEOUT))
    assert not is_collective_failure(RuntimeError("Connection closed by peer [127.0.0.1]:1234"))
    with pytest.raises(CollectiveTimeoutError, match=r"step 3: an unknown collective .* did not complete") as raised:
        with watch_collectives("step 3"):
            raise RuntimeError(GLOO_TIMEOUT)
    assert str(raised.value.__cause__) == GLOO_TIMEOUT


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 1e12, 1, -5, True, "60"])
def test_a_timeout_that_would_fail_inside_timedelta_or_never_end_is_refused(timeout):
    from spmd import SpmdTypeError
    from spmd.multiprocess._process_group import timeouts_for

    with pytest.raises(SpmdTypeError, match=r"timeout must be a number of seconds above 1 and at most 2592000"):
        timeouts_for(timeout)


def test_watch_collectives_takes_a_label_not_a_timeout():
    from spmd import SpmdTypeError

    with pytest.raises(SpmdTypeError, match=r"watch_collectives takes a label .* the timeout is spmd.init_process_gro"):
        with watch_collectives(60):
            pass
