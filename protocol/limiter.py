"""How often a peer that keeps sending what must be refused is answered: a few times per window, the rest counted.

``RejectionLimiter`` keeps, per peer (routing id), the window's start, its rejections and how many of them were
suppressed, in a table of bounded size (the least recently seen peers go first), and the totals per peer that
``status.json`` and ``report.json`` show. Pure bookkeeping: the caller hands it the time; no sockets, no clocks.
"""

from __future__ import annotations

from collections import OrderedDict


class RejectionLimiter:
    """Per peer, at most ``burst`` answered (and logged) rejections per ``window_s``; the rest are counted and
    reported once per window. The table holds at most ``peers`` entries (the least recently seen go first)."""

    def __init__(self, burst: int = 10, window_s: float = 10.0, peers: int = 1024) -> None:
        self.burst, self.window_s, self.peers = burst, window_s, peers
        self.table: OrderedDict[bytes, list[float]] = OrderedDict()  # peer -> [window start, count, suppressed]
        self.totals: dict[bytes, int] = {}

    def largest(self, count: int = 100) -> dict[str, int]:
        """Rejections per peer (routing id, as text), the ``count`` largest totals."""
        totals = sorted(self.totals.items(), key=lambda kv: -kv[1])[:count]
        return {peer.decode(errors="replace"): n for peer, n in totals}

    def admit(self, peer: bytes, now: float) -> tuple[bool, int]:
        """(answer this one?, rejections suppressed in the window that just ended, to report)."""
        entry = self.table.pop(peer, None)
        report = 0
        if entry is None or now - entry[0] >= self.window_s:
            report = int(entry[2]) if entry is not None else 0
            entry = [now, 0.0, 0.0]
        entry[1] += 1
        admitted = entry[1] <= self.burst
        if not admitted:
            entry[2] += 1
        self.table[peer] = entry
        while len(self.table) > self.peers:
            self.table.popitem(last=False)
        if len(self.totals) < self.peers or peer in self.totals:
            self.totals[peer] = self.totals.get(peer, 0) + 1
        return admitted, report
