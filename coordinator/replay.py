"""Playing an asynchronous run's dispatch journal again (``coordinator replay RUN``; docs/protocol.md, "Replay").

``play_journal`` drives a session over a ``simulation.fleet.ScriptedFleet`` by the journal a run wrote
(dispatches.jsonl, kept by ``protocol.versions``) instead of by its clock and its devices: each task goes to the
client the run sent it to, on the version it was sent on; each accepted update is received in the order the run
received it, trained by THE client-round function for the steps its device said it trained; each lost task is
given up (its client is sent Cancel); each flush closes the version on the one aggregation path and writes its rows,
checkpoint and Commits. So the coordinator's protocol, rules and records run as they ran, and the final model is the
run's, bit for bit, wherever the devices' training is (the same machine: kernels and thread counts change bits).
Where the replay's protocol disagrees with the journal (a task's id, base version or attempt, an update refused, a
flush of other tasks) it stops with ``ReplayDiverged``, naming the entry. A thin driver like
``coordinator.asynchronous``: no rule of its own, no algorithm by name, no sockets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedge import codec
from fedge.coordinator.asynchronous import begin_version, finish_version
from fedge.protocol.versions import VersionRounds

# each entry's fields and their types
EVENTS: dict[str, dict[str, type]] = {
    "start": {"clients": int},
    "task": {"task": int, "client": int, "client_id": str, "base": int, "attempt": int},
    "update": {"task": int, "client": int, "steps": int},
    "lost": {"task": int, "client": int, "why": str},
    "flush": {"version": int, "tasks": list},
}


class ReplayDiverged(RuntimeError):
    """The replay's protocol did not do what the journal says the run's did."""


def check_journal(journal: Sequence[dict[str, Any]], rounds: int) -> None:
    """ValueError (one line) for a journal that cannot be replayed: a resumed run's (the tasks of the version a crash
    cut short are not in it), an entry that is not one of ``EVENTS`` with its fields, one without its start, or one
    that flushes fewer than ``rounds`` versions."""
    for number, entry in enumerate(journal, 1):
        event = entry.get("event") if isinstance(entry, dict) else None
        if event == "resumed":
            raise ValueError(f"the run was resumed at version {entry.get('version')} (journal line {number}): "
                             "a crash loses what its journal held of the version being built, so only a run "
                             "without a resume can be replayed")
        if event not in EVENTS:
            raise ValueError(f"journal line {number}: not an entry of the journal ({str(entry)[:80]})")
        for name, kind in EVENTS[event].items():
            if not isinstance(entry.get(name), kind) or isinstance(entry.get(name), bool):
                raise ValueError(f"journal line {number}: a {event} entry needs {name} ({kind.__name__})")
    if not journal or journal[0]["event"] != "start":
        raise ValueError("the journal does not begin with the session's start (a run of an older Fedge?)")
    flushes = sum(1 for entry in journal if entry["event"] == "flush")
    if flushes < rounds:
        raise ValueError(f"the journal flushes {flushes} versions, and the run's configuration asks for {rounds}")


def play_journal(session: Any, versions: VersionRounds, journal: Sequence[dict[str, Any]], fleet: Any) -> int:
    """Play the journal's versions up to ``run.rounds`` (entries after the last of them, of a version the run did
    not finish, are left); returns the number of updates received."""
    protocol, position, received = session.protocol, 0, 0
    while session.round < session.config.run.rounds:
        started = begin_version(session, versions)
        while True:
            number, entry = position + 1, journal[position]
            position += 1
            event, where = entry["event"], f"journal line {number} ({entry['event']} of task {entry.get('task')})"
            if event == "start":
                continue
            if event == "task":
                send = protocol.dispatch(int(entry["client"]), session.clock())
                task = send.message
                assert isinstance(task, codec.Task)
                got = (task.round, task.base_version, task.attempt)
                if got != (entry["task"], entry["base"], entry["attempt"]):
                    raise ReplayDiverged(f"{where}: the replay sent task {got[0]} on version {got[1]} (attempt "
                                         f"{got[2]}), the run task {entry['task']} on version {entry['base']} "
                                         f"(attempt {entry['attempt']})")
                session.act([send])
            elif event == "update":
                task_id = int(entry["task"])
                held = versions.rounds.in_flight.get(task_id)
                if held is None:
                    raise ReplayDiverged(f"{where}: the task is not in flight in the replay")
                fleet.deliver(session.registry.by_index(held.index).client_id, task_id)
                def answered(task_id: int = task_id) -> bool:
                    return task_id not in versions.rounds.in_flight

                for _ in range(100):  # its update is in the fleet's outbox, behind at most a few heartbeats
                    session.pump(0, until=answered)
                    if answered():
                        break
                if not any(arrival.task_id == task_id for arrival in versions.rounds.buffered):
                    raise ReplayDiverged(f"{where}: the run accepted the update; the replay did not (see its "
                                         "coordinator.log)")
                received += 1
            elif event == "lost":
                held = versions.rounds.in_flight.get(int(entry["task"]))
                if held is None:
                    raise ReplayDiverged(f"{where}: the task is not in flight in the replay")
                session.act([*versions.lost(held.index, str(entry["why"]), held.task_id),
                             versions.cancel(protocol.run_id, held, f"replayed: {entry['why']}")])
            else:  # a flush: the run's version was these updates, in this order
                buffered = [arrival.task_id for arrival in versions.rounds.buffered]
                if not versions.rounds.flush_due or buffered != list(entry["tasks"]):
                    raise ReplayDiverged(f"journal line {number}: the run flushed version {entry['version']} "
                                         f"with tasks {entry['tasks']}, the replay holds {buffered}")
                break
        finish_version(session, started)
    return received
