"""Running under systemd: READY once the loop runs, a watchdog that pings only while the loop makes progress, STOPPING.

A thin use of ``plumbing.sdnotify`` shared by the agent and the coordinator's ``--service`` mode; outside systemd
(no NOTIFY_SOCKET) it does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from fedge.plumbing import sdnotify


class ServiceNotifier:
    """Context manager: READY=1 on entry with a progress-gated watchdog, STOPPING=1 on exit; ``show`` sets the
    one-line status ``systemctl status`` prints (sent only when it changes)."""

    def __init__(self, progress: Callable[[], int], status: str = "running") -> None:
        self.progress = progress
        self.status = status
        self.watchdog: sdnotify.Watchdog | None = None

    def show(self, status: str) -> None:
        if status != self.status:
            self.status = status
            sdnotify.status(status)

    def __enter__(self) -> ServiceNotifier:
        sdnotify.notify("READY=1", f"STATUS={self.status}")
        interval = sdnotify.watchdog_interval()
        if interval is not None:
            self.watchdog = sdnotify.Watchdog(interval, self.progress)
            self.watchdog.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        sdnotify.notify("STOPPING=1")
