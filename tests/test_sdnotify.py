"""plumbing.sdnotify against a socket that plays systemd: datagrams arrive, the watchdog follows progress."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedge.plumbing import sdnotify
from tests.e2e import FAST, Processes


class FakeSystemd:
    """The receiving end of $NOTIFY_SOCKET: a bound AF_UNIX datagram socket."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)

    def receive(self, timeout: float = 2.0) -> list[str]:
        """The states of the next datagram, split into lines; fails the test when none comes in time."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            pytest.fail(f"no notification within {timeout} s")
        return data.decode().split("\n")

    def drain(self, quiet: float) -> list[list[str]]:
        """Every datagram that arrives until none has come for `quiet` seconds."""
        got = []
        self.sock.settimeout(quiet)
        while True:
            try:
                got.append(self.sock.recv(4096).decode().split("\n"))
            except TimeoutError:
                return got

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def systemd(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    path = tmp_path / "notify"
    fake = FakeSystemd(str(path))
    clean_env.setenv("NOTIFY_SOCKET", str(path))
    yield fake
    fake.close()


@pytest.fixture
def abstract_systemd(clean_env: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    name = f"fedge-test-{uuid.uuid4().hex}"
    fake = FakeSystemd("\0" + name)
    clean_env.setenv("NOTIFY_SOCKET", "@" + name)
    yield fake
    fake.close()


def test_ready_with_status_arrives_as_one_datagram(systemd: FakeSystemd) -> None:
    assert sdnotify.ready("joined   the\nfleet")
    assert systemd.receive() == ["READY=1", "STATUS=joined the fleet"]


def test_each_message_kind(systemd: FakeSystemd) -> None:
    assert sdnotify.status("round 3 of 50")
    assert systemd.receive() == ["STATUS=round 3 of 50"]
    assert sdnotify.stopping()
    assert systemd.receive() == ["STOPPING=1"]
    assert sdnotify.notify("MAINPID=4242", "WATCHDOG=1")
    assert systemd.receive() == ["MAINPID=4242", "WATCHDOG=1"]
    assert sdnotify.extend_timeout(1.5)
    assert systemd.receive() == ["EXTEND_TIMEOUT_USEC=1500000"]
    assert sdnotify.reloading()
    first, stamp = systemd.receive()
    assert first == "RELOADING=1" and stamp.startswith("MONOTONIC_USEC=") and int(stamp.split("=")[1]) > 0


def test_abstract_socket(abstract_systemd: FakeSystemd) -> None:
    assert sdnotify.ready()
    assert abstract_systemd.receive() == ["READY=1"]


def test_no_op_without_notify_socket(clean_env: pytest.MonkeyPatch) -> None:
    assert sdnotify.ready("x") is False
    assert sdnotify.notify("WATCHDOG=1") is False
    assert sdnotify.watchdog_interval() is None
    watchdog = sdnotify.Watchdog()
    assert not watchdog.enabled
    with watchdog:
        watchdog.progress()
    assert watchdog.pings == 0


def test_unreachable_or_unknown_address_returns_false(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert sdnotify.ready() is False
    clean_env.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert sdnotify.ready() is False


def test_malformed_states_are_refused(systemd: FakeSystemd) -> None:
    with pytest.raises(ValueError):
        sdnotify.notify()
    with pytest.raises(ValueError):
        sdnotify.notify("READY")
    with pytest.raises(ValueError):
        sdnotify.notify("STATUS=a\nb")


def test_watchdog_interval_reads_usec_and_checks_pid(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("WATCHDOG_USEC", "600000000")
    assert sdnotify.watchdog_interval() == 600.0
    clean_env.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == 600.0
    clean_env.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert sdnotify.watchdog_interval() is None
    clean_env.setenv("WATCHDOG_PID", str(os.getpid()))
    for bad in ("0", "-5", "ten"):
        clean_env.setenv("WATCHDOG_USEC", bad)
        assert sdnotify.watchdog_interval() is None


def test_watchdog_pings_while_progress_and_stops_when_stalled(
    systemd: FakeSystemd, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("WATCHDOG_USEC", "200000")  # 0.2 s: a ping every 0.1 s
    clean_env.setenv("WATCHDOG_PID", str(os.getpid()))
    watchdog = sdnotify.Watchdog(stall_after=0.3)
    assert watchdog.interval == pytest.approx(0.2)
    with watchdog:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # a loop that keeps moving
            watchdog.progress()
            time.sleep(0.02)
        moving = systemd.drain(quiet=0.05)
        assert sum(states == ["WATCHDOG=1"] for states in moving) >= 4
        assert not watchdog.stalled

        # The loop hangs: after stall_after the pings stop, and one STATUS says why.
        deadline = time.monotonic() + 5.0
        while not watchdog.stalled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watchdog.stalled
        during_stall = systemd.drain(quiet=0.2)
        assert any(states[0].startswith("STATUS=stalled") for states in during_stall)
        assert systemd.drain(quiet=0.5) == []

        # Progress again: pinging resumes.
        watchdog.progress()
        assert systemd.receive(timeout=1.0) == ["WATCHDOG=1"]
        assert not watchdog.stalled
    pings = watchdog.pings
    time.sleep(0.25)
    assert watchdog.pings == pings  # stop() ended the thread


def test_watchdog_with_its_own_sender_and_validation() -> None:
    sent: list[tuple[str, ...]] = []

    def send(*states: str) -> bool:
        sent.append(states)
        return True

    with sdnotify.Watchdog(interval=0.1, send=send) as watchdog:
        time.sleep(0.02)
    assert sent[0] == ("WATCHDOG=1",) and watchdog.pings == len(sent)
    with pytest.raises(ValueError):
        sdnotify.Watchdog(interval=0)
    with pytest.raises(ValueError):
        sdnotify.Watchdog(interval=1, stall_after=-1)


def test_watchdog_follows_a_counter() -> None:
    sent: list[tuple[str, ...]] = []
    steps = 0

    def send(*states: str) -> bool:
        sent.append(states)
        return True

    with sdnotify.Watchdog(0.1, lambda: steps, stall_after=0.15, send=send) as watchdog:
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:  # the loop moves: the counter changes
            steps += 1
            time.sleep(0.01)
        assert not watchdog.stalled
        pings_while_moving = watchdog.pings
        assert pings_while_moving >= 4
        deadline = time.monotonic() + 5.0
        while not watchdog.stalled and time.monotonic() < deadline:  # the counter stands still
            time.sleep(0.01)
        assert watchdog.stalled
        pings_at_stall = watchdog.pings
        time.sleep(0.3)
        assert watchdog.pings == pings_at_stall
        steps += 1  # moving again
        deadline = time.monotonic() + 5.0
        while watchdog.pings == pings_at_stall and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watchdog.pings > pings_at_stall and not watchdog.stalled


def test_log_lines_to_the_journal_carry_their_priority_and_no_timestamp(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import logging
    import os

    from fedge.plumbing import logsetup

    stream = open(tmp_path / "stderr", "w+")  # noqa: SIM115 - closed below
    try:
        assert not logsetup.is_journal(stream)
        info = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{info.st_dev}:{info.st_ino}")
        assert logsetup.is_journal(stream)
        monkeypatch.setattr(logsetup.sys, "stderr", stream)
        logsetup.setup_logging()
        log = logging.getLogger("fedge.test")
        log.warning("disk nearly full")
        log.info("round 3 committed")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("round failed")
        for handler in logging.getLogger().handlers:
            handler.flush()
        lines = (tmp_path / "stderr").read_text().splitlines()
    finally:
        logging.getLogger().handlers.clear()
        stream.close()
    assert lines[0] == "<4>fedge.test: disk nearly full" and lines[1] == "<6>fedge.test: round 3 committed"
    assert lines[2] == "<3>fedge.test: round failed" and all(line.startswith("<3>") for line in lines[2:])
    assert any("ValueError: boom" in line for line in lines[2:])


def test_log_files_rotate_and_keep_a_bounded_number_of_older_files(tmp_path: Path) -> None:
    import json
    import logging

    from fedge.plumbing import logsetup

    path = tmp_path / "coordinator.log"
    logsetup.setup_logging(log_file=str(path), quiet=True, max_bytes=4000, backups=2)
    try:
        for i in range(400):
            logging.getLogger("fedge.test").info("line %d %s", i, "x" * 40)
    finally:
        for handler in logging.getLogger().handlers:
            handler.close()
        logging.getLogger().handlers.clear()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["coordinator.log", "coordinator.log.1", "coordinator.log.2"]
    assert all((tmp_path / n).stat().st_size <= 4000 for n in names)
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["msg"].startswith("line 399")


def test_the_services_status_lines_say_what_they_do(systemd: FakeSystemd, procs: Processes, tmp_path: Path) -> None:
    """A coordinator run as a service, and its local agents, tell systemd their state in the STATUS line."""
    import threading

    received: list[list[str]] = []
    done = threading.Event()

    def listen() -> None:  # systemd reads at once; a datagram queue holds only a few
        while not done.is_set():
            received.extend(systemd.drain(0.2))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        coordinator = procs.coordinator("--service", "--rounds", "2", "--local-fleet", "2", "--run-dir",
                                        str(tmp_path / "run"), *FAST)
        procs.finish(coordinator, "coordinator", 240)
    finally:
        done.set()
        listener.join(5)
    statuses = [state[len("STATUS="):] for datagram in received for state in datagram if state.startswith("STATUS=")]
    coordinator_lines = [s for s in statuses if "agents connected" in s]
    assert any("round 1/2; 2/2 agents connected" in s for s in coordinator_lines), statuses
    assert any(s.startswith("training round 1 as client ") for s in statuses), statuses


def test_a_full_notification_queue_drops_instead_of_blocking(systemd: FakeSystemd) -> None:
    started = time.monotonic()
    sent = [sdnotify.notify(f"STATUS=line {i}") for i in range(200)]  # nobody reads: the queue fills up
    assert time.monotonic() - started < 5 and sent[0] and not all(sent)
