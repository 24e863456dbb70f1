"""The session's asynchronous loop (``round.mode = "async"``; docs/protocol.md, "Asynchronous rounds").

``play_versions`` drives the protocol's asynchronous side (``protocol.versions``) for a ``coordinator.session.Session``:
it keeps ``asynchronous.concurrency`` tasks in flight on the live, unquarantined devices that hold none (which idle
device gets the next task is drawn from (run seed, task id)), lets tasks past ``round.deadline_s`` or of devices
gone fall out, folds each accepted update as it arrives on the one aggregation path (one ``Aggregation`` a version,
with the session's bounds and server step), and at every ``asynchronous.buffer`` accepted updates flushes the
version: closes it, cancels what it leaves out of reach, writes its rows (``round`` is the version), then its
checkpoint (with the task table), then its Commits. A resumed session takes up the task table where its checkpoint
left it. A thin driver: the rules are the protocol's; no algorithm by name. Its functions take the session (typed
loosely: the session module imports this one, and the import graph has no cycles).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from fedge.coordinator.rows import agent_record, client_rows_of_version, version_row
from fedge.meter import attribute_energy
from fedge.protocol.asynchronous import AsyncRounds
from fedge.protocol.server_half import Aggregation
from fedge.protocol.versions import VersionRounds

log = logging.getLogger("fedge.coordinator")

STATE_KEY = "asynchronous"  # the task table's place in the checkpoint's meta
JOURNAL = "dispatches.jsonl"  # the run's dispatch journal (``protocol.versions``; ``coordinator replay`` reads it)


def start(session: Any, resumed: dict[str, Any] | None) -> VersionRounds:
    """The session's versions: from the checkpoint's task table, or from version 0."""
    settings = session.config.asynchronous.settings()
    rounds = AsyncRounds.restored(settings, resumed) if resumed else AsyncRounds(settings)
    now = session.clock()
    if not session.simulated_clock:  # sent by the process before, on another clock: its deadline counts from now
        for task in rounds.in_flight.values():
            task.sent_at = now
    versions = VersionRounds(rounds, session.registry, session.shapes, session.task_flags,
                             session.config.round.deadline_s, now,
                             device_state=bool(getattr(session.server, "device_state", False)))  # (a plugin's: no)
    session.protocol.start_versions(versions)
    if session.resumed:  # what the journal held of the version being built may be lost or doubled: it says so
        session.run_dir.append_jsonl(JOURNAL, {"event": "resumed", "version": rounds.version})
    else:  # the session's size (a replay builds the same)
        session.run_dir.append_jsonl(JOURNAL, {"event": "start", "clients": session.registry.capacity})
    return versions


def write_journal(session: Any, versions: VersionRounds) -> None:
    """Append what the journal holds to the run's dispatches.jsonl (before a version's checkpoint, and at the end)."""
    entries = versions.take_journal()
    if entries:
        session.run_dir.append_jsonl(JOURNAL, *entries)


def quarantined(session: Any, versions: VersionRounds, now: float) -> set[int]:
    """The devices the quarantine keeps out of this version, live now or not (``SessionTrust.selectable``, asked once
    a version: it reads the operator's clear requests, starts the version's count of refusals, and waives the
    quarantine when it would leave fewer live devices than ``round.min_clients``, or, for devices that keep state,
    than ``asynchronous.buffer``: each gives one update a version)."""
    registry = session.registry
    live = registry.live_indices(now)
    least = max(session.config.round.min_clients, 1, versions.rounds.settings.buffer if versions.device_state else 1)
    kept = session.trust.selectable(live, registry, least)
    held = {registry.agents[c].index for c in session.trust.quarantine.quarantined if c in registry.agents}
    waived = len(kept) == len(live) and any(index in held for index in live)
    return set() if waived else held


def fill(session: Any, versions: VersionRounds, now: float, live: list[int], held_out: set[int]) -> None:
    """Send tasks while the rules leave room and a ``live`` device, not held out, holds none."""
    idle = versions.idle([i for i in live if i not in held_out])
    while idle and versions.rounds.room() > 0:
        pick = versions.pick(idle, session.config.run.seed)
        idle.remove(pick)
        session.act([session.protocol.dispatch(pick, now)])


def play_versions(session: Any, versions: VersionRounds) -> str:
    """Play versions (``start`` made them, before the session waited for its agents, so that a resumed session's
    devices are answered by the task table) until ``run.rounds`` are committed: 'done'; 'stopped' when asked to stop;
    'no-agents' when no device was live, and no task in flight, for ``fleet.join_timeout_s``."""
    try:
        return play(session, versions)
    finally:
        versions.finish()  # (an update the session reads after this is refused; while it says goodbye, dropped)
        write_journal(session, versions)
        session.horizon(math.inf)


def begin_version(session: Any, versions: VersionRounds) -> float:
    """The next version's aggregation, on the one path; returns when it began (the real clock)."""
    session.spent = dict.fromkeys(session.spent, 0.0)
    session.aggregation = Aggregation(session.server, versions.version + 1, session.trust.influence,
                                      step=session.step, keep=session.trust.spill.keep)
    return time.monotonic()


def play(session: Any, versions: VersionRounds) -> str:
    protocol = session.protocol
    while session.round < session.config.run.rounds:
        started = begin_version(session, versions)
        held_out = quarantined(session, versions, session.clock())
        alone_since: float | None = None  # since when no task is in flight and no live device can take one
        while not versions.rounds.flush_due:
            if session.stopping:
                return "stopped"
            now = session.clock()
            live = session.registry.live_indices(now)  # once a turn of the loop: a scan of every device
            allowed = [i for i in live if i not in held_out]
            if versions.rounds.in_flight or versions.idle(allowed):
                alone_since = None
            elif alone_since is None:
                alone_since = now
                log.warning("%s; waiting for agents to come (back)", stall(versions, allowed))
            elif now - alone_since > session.config.fleet.join_timeout_s:
                return "no-agents"
            session.act(versions.expire(protocol.run_id, now, set(live).__contains__))
            fill(session, versions, now, live, held_out)
            session.horizon(versions.next_deadline())
            session.pump(100, until=lambda: versions.rounds.flush_due)  # a version takes exactly ``buffer``
            session.write_status(f"version {versions.version + 1}: {len(versions.rounds.buffered)}/"
                                 f"{versions.rounds.settings.buffer} updates, {len(versions.rounds.in_flight)} "
                                 "tasks in flight")
        finish_version(session, started)
        session.write_status(f"version {session.round} done", force=True)
    return "done"


def stall(versions: VersionRounds, live: list[int]) -> str:
    """Why no task is in flight and none can be sent."""
    if not live:
        return "no live agent (out of quarantine) and no task in flight"
    waiting = len({update[0] for update in versions.building.updates})
    return (f"no task in flight and none of the {len(live)} live agents can take one ({waiting} hold an update that "
            f"waits for version {versions.version + 1}'s flush, which needs {versions.rounds.settings.buffer})")


def finish_version(session: Any, started: float) -> None:
    """Flush the version: close its aggregation, cancel what it leaves out of reach, write its rows, then its
    checkpoint, then its Commits."""
    session.rows.flush()  # the previous version's row: its evaluation ran beside this version
    closing = time.monotonic()
    metrics = session.close_aggregation(session.protocol.versions.version + 1)
    session.spent["close_s"] = time.monotonic() - closing
    flush, record, cancels = session.protocol.close_version(session.clock())
    session.act(cancels)
    number = flush.version
    bounds = session.trust.note_round(number, session.aggregation.bounded, unit="version")
    ids = {index: session.registry.by_index(index).client_id for index in
           {*(u[0] for u in record.updates), *record.bytes_down}}
    records = [agent_record(dict(update.record), size, session.transport.curve)
               for _, _, update, size, _ in record.updates]
    row = version_row(number, session.config.algorithm_name, flush, record, metrics, records)
    session.run_dir.append_jsonl("clients.jsonl", *client_rows_of_version(number, record, ids, records,
                                                                          attribute_energy(records), bounds))
    sizes: dict[int, int] = {}
    for index, _, _, size, _ in record.updates:  # a fast device may have two updates in one version
        sizes[index] = sizes.get(index, 0) + size
    session.tallies.note_round(number, ids, record.bytes_down, sizes, ())
    row["wall_s"] = time.monotonic() - started
    if session.simulated_clock:
        row["sim_time_s"] = session.clock()
    held = session.hold_row(row, number)
    session.bytes_total["down"] += int(row["bytes_down"])
    session.bytes_total["up"] += int(row["bytes_up"])
    write_journal(session, session.protocol.versions)
    session.act(session.protocol.flush_version(number))  # its checkpoint, then its Commits
    session.spent["tail_s"] = time.monotonic() - session.last_accepted
    held.row.update(session.spent, checkpoint_s=session.checkpoint_s)
    if not held.waiting:
        session.rows.flush()
    session.round_walls.append(row["wall_s"])
