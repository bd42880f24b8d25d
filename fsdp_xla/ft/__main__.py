"""``python -m fsdp_xla.ft``: serve a lighthouse, or start a whole healing HSDP run on this host.

python -m fsdp_xla.ft lighthouse --min-replicas 1
python -m fsdp_xla.ft run --groups 2 --nproc-per-group 2 examples/train_heal.py --steps 300
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable

from fsdp_xla.errors import FSDPError, TorchftNotInstalledError
from fsdp_xla.ft._launch import launch_groups
from fsdp_xla.ft._lighthouse import Lighthouse

__all__ = ["main"]


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``minimum`` (argparse's ``int`` takes 0 and negatives)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an int >= {minimum}, got {text!r}")
        return value

    return parse


def _seconds(text: str) -> float:
    """An argparse type: seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fsdp_xla.ft", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, what in (("lighthouse", "serve torchft's lighthouse until stopped"), ("run", "lighthouse + groups")):
        sub = commands.add_parser(name, help=what)
        sub.add_argument(
            "--min-replicas", type=_count(1), default=1, help="fewest replica groups a step may commit with"
        )
        sub.add_argument("--bind", default="[::]:29510", help="host:port the lighthouse listens on")
        sub.add_argument("--join-timeout", type=_seconds, default=60.0, help="seconds to wait for a group to join")
        sub.add_argument(
            "--heartbeat-timeout", type=_seconds, default=5.0, help="seconds before a silent group is lost"
        )
    run = commands.choices["run"]
    run.add_argument("--groups", type=_count(1), default=2, help="replica groups (torchrun jobs)")
    run.add_argument("--nproc-per-group", type=_count(1), default=2, help="ranks per group (FSDP's shard axes)")
    run.add_argument("--max-restarts", type=_count(0), default=10, help="restarts of each group (torchrun's)")
    run.add_argument("script", help="the training script (reads TORCHFT_LIGHTHOUSE and REPLICA_GROUP_ID)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; a refusal (a busy port, torchft missing, no such script) is one line on
    stderr and exit code 2, as argparse's own."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _serve(args)
    except (FSDPError, TorchftNotInstalledError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")


def _serve(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with Lighthouse(
        min_replicas=args.min_replicas,
        bind=args.bind,
        join_timeout=args.join_timeout,
        heartbeat_timeout=args.heartbeat_timeout,
    ) as lighthouse:
        print(f"lighthouse at {lighthouse.address} (min_replicas={args.min_replicas})", flush=True)
        if args.command == "lighthouse":
            # Polled, not one blocking wait: the lighthouse's native threads can take the signal,
            # and then Python runs the handler only when the main thread wakes (one wait with no
            # timeout left `lighthouse` running after SIGTERM, and the test that stops it hung).
            while not stop.wait(0.5):
                pass
            return 0
        groups = launch_groups(
            args.script,
            args.args,
            lighthouse=lighthouse.address,
            groups=args.groups,
            nproc_per_group=args.nproc_per_group,
            max_restarts=args.max_restarts,
        )
        return _wait(groups, stop)


def _wait(groups: list, stop: threading.Event) -> int:
    """Until every group's torchrun ends (its exit code, the worst first), or until this process
    is told to stop: then each torchrun is told too (it stops its workers) and waited for."""
    while not stop.wait(0.5) and any(group.poll() is None for group in groups):
        pass
    for group in groups:
        if group.poll() is None:
            group.terminate()
    codes = [group.wait() for group in groups]
    return max(codes, key=abs)


if __name__ == "__main__":
    sys.exit(main())
