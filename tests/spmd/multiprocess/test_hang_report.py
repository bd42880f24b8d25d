"""watch_collectives turns only the process group's own collective timeout into
CollectiveTimeoutError; any other error passes through unchanged. (A real gloo timeout, with a
SIGSTOPped rank: tests/test_multiprocess.py.)"""

import re

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


@pytest.mark.parametrize("backend", ["foo", "cpu:gloo,cuda:ncl", "undefined"])
def test_a_backend_torch_does_not_know_is_refused_before_anything_starts(backend):
    """torch's own check is an AssertionError from deep inside process-group creation."""
    import torch.distributed as dist

    from spmd import SpmdTypeError, init_process_group

    with pytest.raises(SpmdTypeError, match=r"which this torch does not know; it knows \['gloo', 'nccl'"):
        init_process_group(backend)
    assert not dist.is_initialized()


@pytest.mark.parametrize("label", [60, "", "  "])
def test_watch_collectives_takes_a_label_not_a_timeout(label):
    """An empty label was taken, and the hang reports named the work ''."""
    from spmd import SpmdTypeError

    with pytest.raises(SpmdTypeError, match=r"watch_collectives takes a label .* the timeout is spmd.init_process_gro"):
        with watch_collectives(label):
            pass


# gloo's texts for a lost connection, as measured (tcp/pair.cc; a peer SIGKILLed, exited, or its
# group destroyed mid-collective), and one from newer gloo's sources, which names the peer's rank.
LOST = {
    "closed, torch 2.15": (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
        "[127.0.0.1]:49373. This is typically caused by a remote worker crashing. Check the logs of the remote "
        "worker before reporting an error. GLHF! \U0001f3d6\ufe0f",
        ("closed by the peer", "[127.0.0.1]:49373", None),
    ),
    "reset, torch 2.15": (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:17083: "
        "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application.",
        ("connection reset by peer", "[127.0.0.1]:17083", None),
    ),
    "closed, torch 2.9": (
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:15243",
        ("closed by the peer", "[127.0.0.1]:15243", None),
    ),
    "reset, torch 2.9": (
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:63137: Connection reset "
        "by peer",
        ("connection reset by peer", "[127.0.0.1]:63137", None),
    ),
    "broken pipe, newer gloo": (
        "[gloo/transport/tcp/pair.cc:300] writev rank 2 ([::1]:4242): Broken pipe",
        ("broken pipe", "[::1]:4242", 2),
    ),
    "after this rank's own timeout": ("Application timeout caused pair closure", (None, None, None)),
}


@pytest.mark.parametrize("text, expected", LOST.values(), ids=LOST.keys())
def test_gloo_s_lost_connections_are_read_with_the_peer_it_names(text, expected):
    from spmd.multiprocess._hang_report import lost_connection

    lost = lost_connection(RuntimeError(text))
    assert lost is not None and not is_collective_failure(RuntimeError(text))
    how, address, rank = expected
    assert (lost.address, lost.group_rank) == (address, rank)
    assert how is None or lost.how == how


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("Connection closed by peer [127.0.0.1]:1234"),  # not from gloo's transport
        RuntimeError("my socket: Connection reset by peer"),
        ConnectionResetError("[gloo/transport/tcp/pair.cc:1] Connection closed by peer [127.0.0.1]:1"),
        RuntimeError(GLOO_TIMEOUT),
    ],
)
def test_other_errors_are_not_lost_connections(error):
    from spmd.multiprocess._hang_report import lost_connection

    assert lost_connection(error) is None


def test_without_the_heartbeat_a_lost_connection_passes_through_unchanged():
    error = RuntimeError(LOST["closed, torch 2.9"][0])
    with pytest.raises(RuntimeError) as raised:
        with watch_collectives("step 3"):
            raise error
    assert raised.value is error


@pytest.fixture
def two_ranks(monkeypatch):
    """This process as rank 0 of 2 with a heartbeat on an in-memory store (probe 1 s, grace
    0.1 s); rank 1's beat is whatever the test writes (a counter that never moves)."""
    import torch.distributed as dist

    from spmd.multiprocess import _process_group, _sigterm
    from spmd.multiprocess._process_group import Beat, Heartbeat, timeouts_for

    monkeypatch.setattr(_sigterm, "REPORT_GRACE", 0.1)
    store = dist.HashStore()
    beat = Heartbeat(store, 0, 2, timeouts_for(2))
    monkeypatch.setattr(_process_group, "_heartbeat", [beat])

    def peer(label: str, ended: bool = False) -> None:
        store.set("rank1", Beat(7, {}, label, ended).encode())

    yield peer
    beat.stop()


@pytest.mark.parametrize("text", [LOST["closed, torch 2.15"][0], LOST["reset, torch 2.9"][0]])
def test_a_lost_connection_names_the_rank_whose_heartbeat_stopped(two_ranks, text):
    from spmd import PeerLostError

    two_ranks("after step 2")
    with pytest.raises(PeerLostError) as raised:
        with watch_collectives("step 3"):
            raise RuntimeError(text)
    message = str(raised.value)
    assert isinstance(raised.value, CollectiveTimeoutError) and str(raised.value.__cause__) == text
    assert re.search(
        r"step 3: an unknown collective .* did not complete: rank 0 lost its connection to the peer at", message
    )
    assert "no timeout passed): rank 1: its heartbeat stopped (last at 'after step 2')" in message
    assert "within the timeout" not in message


def test_a_peer_that_exited_is_told_from_one_that_stopped(two_ranks):
    from spmd import PeerLostError

    two_ranks("step 3, raising ValueError", ended=True)
    with pytest.raises(PeerLostError, match=r"rank 1: its process ended \(last at 'step 3, raising ValueError'\)"):
        with watch_collectives("step 3"):
            raise RuntimeError(LOST["closed, torch 2.9"][0])


def test_a_lost_connection_with_every_heartbeat_going_says_no_rank_stopped(two_ranks):
    from spmd import PeerLostError
    from spmd.multiprocess._process_group import Heartbeat, heartbeat

    beat = heartbeat()
    rank_1 = Heartbeat(beat.store, 1, 2, beat.timeouts)  # alive: its counter moves
    try:
        with pytest.raises(PeerLostError, match=r"every rank's heartbeat goes on .* the peer's process did not end"):
            with watch_collectives("step 3"):
                raise RuntimeError(LOST["closed, torch 2.9"][0])
    finally:
        rank_1.stop()


def test_with_the_heartbeat_other_errors_still_pass_through_unchanged_and_say_how_the_rank_left(two_ranks):
    from spmd.multiprocess._process_group import Beat, heartbeat

    error = ValueError("bad batch")
    with pytest.raises(ValueError) as raised:
        with watch_collectives("step 3"):
            raise error
    assert raised.value is error
    beat = heartbeat()
    assert Beat.decode(beat.store.get("rank0").decode()).label == "step 3, raising ValueError"


def test_an_outer_block_passes_an_inner_block_s_report_on_and_keeps_its_label(two_ranks):
    from spmd import PeerLostError
    from spmd.multiprocess._process_group import Beat, heartbeat

    two_ranks("after step 2")
    with pytest.raises(PeerLostError, match=r"^step 3, save: .* rank 1: its heartbeat stopped") as raised:
        with watch_collectives("step 3"):
            with watch_collectives("step 3, save"):
                raise RuntimeError(LOST["closed, torch 2.9"][0])
    assert str(raised.value.__cause__) == LOST["closed, torch 2.9"][0]
    assert Beat.decode(heartbeat().store.get("rank0").decode()).label == "step 3, save"


def test_heartbeats_that_cannot_be_read_are_said_so_not_guessed(two_ranks, monkeypatch):
    from spmd import PeerLostError
    from spmd.multiprocess._process_group import heartbeat

    def gone():
        raise RuntimeError("the store is gone")

    monkeypatch.setattr(heartbeat(), "read", gone)
    with pytest.raises(
        PeerLostError, match=r"no timeout passed\): the heartbeats could not be read \(the store is gone\)"
    ):
        with watch_collectives("step 3"):
            raise RuntimeError(LOST["closed, torch 2.9"][0])
