"""systemd's readiness and watchdog protocol (sd_notify) in plain Python, and a watchdog gated on progress.

    from fedge.plumbing import sdnotify
    sdnotify.ready("waiting for the coordinator")
    with sdnotify.Watchdog() as watchdog:          # pings only while the loop reports progress
        while running:
            step()
            watchdog.progress()
    sdnotify.stopping()

A ``Type=notify`` service finds the address of a datagram socket in ``$NOTIFY_SOCKET`` (a filesystem path, or
an abstract socket written with a leading ``@``) and sends it newline-separated ``KEY=VALUE`` lines: ``READY=1``
once started, ``STATUS=...`` for ``systemctl status``, ``WATCHDOG=1`` at least every ``WatchdogSec``,
``STOPPING=1``, ``RELOADING=1``. Outside systemd the variable is unset and every call here does nothing and
returns False, so callers need no ``if``. The protocol is documented in sd_notify(3).

``Watchdog`` pings at half systemd's interval, and only while the caller's loop shows progress, either by calling
``progress()`` or through a counter it increments (``Watchdog(interval, lambda: loop.steps)``): a loop that hangs
(a stuck collective, a dead socket) stops the pings, and systemd kills and restarts the service within
``stall_after + interval`` seconds of the last progress (plus up to one ping period with a counter, which is read
once a period). ``stall_after`` defaults to the interval, so ``WatchdogSec`` is the longest a loop may go without
progress.

Standard library only; knows nothing of the agent, the coordinator, torch or zmq, and is safe to use from both.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

__all__ = [
    "Watchdog",
    "extend_timeout",
    "notify",
    "ready",
    "reloading",
    "status",
    "stopping",
    "watchdog_interval",
]

log = logging.getLogger(__name__)


def _address(value: str) -> str | None:
    """$NOTIFY_SOCKET as a socket address: '@name' is the abstract socket '\\0name'; other forms are unsupported."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def notify(*states: str) -> bool:
    """Send states (each 'KEY=VALUE') to systemd in one datagram; True when it was sent, False otherwise.

    False without $NOTIFY_SOCKET (not started by systemd, or not Type=notify), for an address form this module
    does not speak (only paths and '@abstract' names), or when sending failed (logged at warning level): losing
    a notification must never take the service down, nor wait: the socket does not block.
    """
    if not states:
        raise ValueError("notify() needs at least one state, such as 'READY=1'")
    for state in states:
        if "=" not in state or "\n" in state:
            raise ValueError(f"a state is one 'KEY=VALUE' line, got {state!r}")
    value = os.environ.get("NOTIFY_SOCKET", "")
    if not value:
        return False
    address = _address(value)
    if address is None:
        log.warning("NOTIFY_SOCKET=%r is neither a path nor an @abstract name; not notifying", value)
        return False
    payload = "\n".join(states).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)  # a slow reader must never stall the service: a full queue drops the datagram
            sock.connect(address)
            sock.sendall(payload)
    except BlockingIOError:
        log.debug("systemd's notification queue is full; dropped %r", payload[:80])
        return False
    except OSError as exc:
        log.warning("could not notify systemd at %r: %s", value, exc)
        return False
    return True


def ready(status_text: str | None = None) -> bool:
    """READY=1 (startup finished), with an optional STATUS line."""
    return notify("READY=1", *(() if status_text is None else (f"STATUS={_one_line(status_text)}",)))


def status(text: str) -> bool:
    """STATUS=text: the line `systemctl status` shows."""
    return notify(f"STATUS={_one_line(text)}")


def stopping(status_text: str | None = None) -> bool:
    """STOPPING=1 (shutdown begun), with an optional STATUS line."""
    return notify("STOPPING=1", *(() if status_text is None else (f"STATUS={_one_line(status_text)}",)))


def reloading() -> bool:
    """RELOADING=1 with the MONOTONIC_USEC stamp that Type=notify-reload requires; send ready() when done."""
    return notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def extend_timeout(seconds: float) -> bool:
    """EXTEND_TIMEOUT_USEC: ask for this much more time to start or stop (a long checkpoint, say)."""
    return notify(f"EXTEND_TIMEOUT_USEC={max(1, round(seconds * 1_000_000))}")


def watchdog_interval() -> float | None:
    """systemd's watchdog interval in seconds ($WATCHDOG_USEC), or None when no watchdog is set for this process.

    None as well when $WATCHDOG_PID names another process (the variable was inherited by a child) or when
    either variable is malformed.
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID", "")
    try:
        if pid and int(pid) != os.getpid():
            return None
        value = int(usec)
    except ValueError:
        log.warning("ignoring malformed WATCHDOG_USEC=%r / WATCHDOG_PID=%r", usec, pid)
        return None
    return value / 1_000_000 if value > 0 else None


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Watchdog:
    """A daemon thread that sends WATCHDOG=1 every interval/2 while the owner's loop makes progress.

    interval: systemd's watchdog interval in seconds; by default watchdog_interval(). With no interval (no
    WatchdogSec, or not under systemd) start() does nothing, so the same code runs everywhere.
    counter: optional; a function returning a number the loop increments as it goes. The thread reads it each
    period and a new value counts as progress, as a call to progress() does.
    stall_after: how long without progress before the pings stop (default: the interval). start() counts as
    progress.
    send: the function that delivers a ping; notify by default (tests may pass their own).
    """

    def __init__(
        self,
        interval: float | None = None,
        counter: Callable[[], int] | None = None,
        *,
        stall_after: float | None = None,
        send: Callable[..., bool] = notify,
    ) -> None:
        self.interval = watchdog_interval() if interval is None else interval
        if self.interval is not None and self.interval <= 0:
            raise ValueError(f"watchdog interval must be > 0 seconds, got {self.interval}")
        self.stall_after = self.interval if stall_after is None else stall_after
        if self.stall_after is not None and self.stall_after <= 0:
            raise ValueError(f"stall_after must be > 0 seconds, got {self.stall_after}")
        self._counter = counter
        self._last_count = counter() if counter is not None else 0
        self._send = send
        self._lock = threading.Lock()
        self._last_progress = time.monotonic()
        self._pings = 0
        self._stalled = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        """True when there is an interval to keep, i.e. start() runs a thread."""
        return self.interval is not None

    @property
    def pings(self) -> int:
        """How many WATCHDOG=1 messages were sent successfully."""
        with self._lock:
            return self._pings

    @property
    def stalled(self) -> bool:
        """True once pings were withheld because progress() was not called within stall_after."""
        with self._lock:
            return self._stalled

    def progress(self) -> None:
        """Record that the owner's loop moved on; call it from the loop, including idle poll timeouts."""
        with self._lock:
            self._last_progress = time.monotonic()
            self._stalled = False

    def start(self) -> Watchdog:
        """Start pinging (a no-op when not enabled or already started); returns self."""
        if self.interval is None or self._thread is not None:
            return self
        self.progress()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sd-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop pinging and wait for the thread to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        assert self.interval is not None and self.stall_after is not None
        period = self.interval / 2
        while True:
            if self._counter is not None:
                count = self._counter()
                if count != self._last_count:
                    self._last_count = count
                    self.progress()
            with self._lock:
                quiet = time.monotonic() - self._last_progress
                alive = quiet <= self.stall_after
                newly_stalled = not alive and not self._stalled
                if not alive:
                    self._stalled = True
            if alive:
                if self._send("WATCHDOG=1"):
                    with self._lock:
                        self._pings += 1
            elif newly_stalled:
                log.warning(
                    "no progress for %.1f s (limit %.1f s): withholding watchdog pings",
                    quiet,
                    self.stall_after,
                )
                self._send(f"STATUS=stalled: no progress for {quiet:.0f} s; waiting for the watchdog")
            if self._stop.wait(period):
                return
