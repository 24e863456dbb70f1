"""THE synchronous round of a ``coordinator.session.Session``: select, send the tasks, gather the updates until the
round completes (its target, its deadline, or every device awaited gone), fold them on the one aggregation path,
and record the round: rows, the checkpoint, then the Commits (docs/run-dir.md, "After a crash", gives the order).

``play_round`` opens and plays a round, ``finish_round`` closes and records it, ``select`` draws its cohort (the
privacy plan's draw, the server half's own choice, or ``round.fraction`` / ``round.count`` by ``round.policy``). A
thin driver beside ``coordinator.asynchronous`` (its versions): the rules are the protocol's, no algorithm by name,
no sockets. Its functions take the session (typed loosely: the session module imports this one, and the import
graph has no cycles).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

import numpy as np

from fedge.coordinator.crashpoints import crash_point
from fedge.coordinator.distributed import BudgetSpent
from fedge.coordinator.rows import agent_record, agents_metrics, client_rows, round_row
from fedge.coordinator.rundir import SPENT_FIELDS
from fedge.meter import attribute_energy
from fedge.protocol.round import RoundState
from fedge.protocol.selection import choose, selection_count
from fedge.protocol.server_half import Aggregation

log = logging.getLogger("fedge.coordinator")


def select(session: Any, round_number: int, available: list[int]) -> list[int]:
    if session.privacy is not None:  # drawn from the whole population; a drawn device offline is a dropout
        drawn = session.privacy.draw(round_number)
        online = set(available)
        session.dropouts = [i for i in drawn if i not in online]
        return [i for i in drawn if i in online]
    rng = np.random.default_rng([session.config.run.seed, round_number])
    chosen = session.server.select(round_number, available, rng)
    if chosen is not None:
        return sorted(int(i) for i in chosen)
    r = session.config.round
    count = selection_count(len(available), r.fraction, r.count, r.min_clients)
    times = {i: session.registry.by_index(i).round_s for i in available} if r.policy != "uniform" else {}
    return choose(available, count, rng, r.policy, times, r.deadline_s)



def play_round(session: Any, number: int) -> dict[str, Any] | None:
    """One round; returns its metrics, or None when the session was asked to stop mid-round."""
    started, now = time.monotonic(), session.clock()
    session.drain()
    session.spent, session.last_accepted = dict.fromkeys(SPENT_FIELDS, 0.0), started
    available = session.trust.selectable(session.registry.live_indices(session.clock()), session.registry,
                                      max(session.config.round.min_clients, 1))
    if session.secagg is not None:
        session.aggregation = Aggregation(session.server, number, step=session.step)
    elif session.privacy is None:
        session.aggregation = Aggregation(session.server, number, session.trust.influence, session.trust.rule,
                                       step=session.step, keep=session.trust.spill.keep)
    else:
        session.aggregation = Aggregation(session.server, number, private=session.privacy.open_round(), step=session.step)
    selected = select(session, number, available)
    try:
        secure = session.secagg.open(session.run_id, number, selected, session.registry, session.server, now) \
            if session.secagg is not None and selected else None
    except BudgetSpent as spent:  # its grid is known before anything is sent: the round is never opened
        log.warning("%s", spent)
        session.budget_spent = True
        return None
    target = session.config.round.target
    if target and secure is not None and session.secagg is not None:
        target = max(target, session.secagg.min_inputs())  # enough inputs for every device's threshold
    session.act(session.protocol.open_round(number, selected, now, session.config.round.deadline_s, target,
                                      secure=secure))
    session.horizon(session.protocol.current.deadline if session.protocol.current is not None else math.inf)
    while not session.protocol.complete(session.clock()):
        if session.stopping:
            session.protocol.abandon_round()
            return None
        session.pump(100)
        if secure is not None:  # the keys and shares stages close by their deadlines too
            session.act(secure.tick(session.clock()))
        current = session.protocol.current
        if current is not None:
            session.write_status(f"round {number}: {len(current.updates)}/{len(current.selected)} updates")
    session.horizon(math.inf)
    current, cancels = session.protocol.close_round(session.clock())
    if session.secagg is not None:  # under distributed noise: accounted before any unmask request goes out
        session.secagg.account_unmask()
    session.act(cancels)
    while secure is not None and not secure.done:  # the unmask stage: the survivors' answers
        if session.stopping:
            session.protocol.abandon_round()
            return None
        session.pump(100)
        session.act(secure.tick(session.clock()))
        session.write_status(f"round {number}: unmasking the sum")
    if session.secagg is not None:  # a sum is kept at once: a crash from here on applies it, never redoes it
        session.secagg.keep(session.run_id, session.index_of)
    if current.awaited() and session.clock() < current.deadline:
        log.warning("round %d: every agent still awaited (%s) is gone; closing the round", number,
                    current.awaited())
    return finish_round(session, current, started)



def finish_round(session: Any, current: RoundState, started: float) -> dict[str, Any]:
    number = current.number
    session.rows.flush()  # the previous round's row: its evaluation ran beside this round
    missing = [i for i in current.selected if i not in current.updates and i not in current.unavailable]
    if missing:  # those whose update was refused, too: the round goes on as if they had sent nothing
        log.warning("round %d: no update from client(s) %s before the deadline%s", number,
                    [i for i in missing if i not in current.refused],
                    f" (refused: {sorted(current.refused)})" if current.refused else "")
        session.server.missed(number, missing)
    closing = time.monotonic()
    secure = session.secagg.fold(session.aggregation, number, session.index_of) if session.secagg is not None else {}
    extra = session.close_aggregation(number)  # folded as they arrived (or held until now, and bounded)
    extra.update(secure)
    late = [i for i in sorted(current.refused) if i not in missing]
    if late:  # refused by the close (held updates): as if they had sent nothing
        session.server.missed(number, late)
    ordered = sorted(current.updates.items())
    session.spent["close_s"] = time.monotonic() - closing
    bounds = session.trust.note_round(number, session.aggregation.bounded)
    if session.privacy is not None:  # accounted (its release-log line fsynced) before anything derived is written
        extra.update(session.privacy.account(number, session.aggregation.released, len(session.aggregation.clipped)),
                     dp_dropouts=len(session.dropouts))
        for record in session.aggregation.clipped:  # the private sum's clip of each update (operator records)
            bounds.setdefault(record.index, {}).update(record.record())
    received = [(session.registry.by_index(i).client_id,
                 dataclasses.replace(u, num_samples=bounds[i]["num_samples"]) if "num_samples" in bounds.get(i, {})
                 else u)
                for i, (u, _) in ordered]  # the counted sample counts weigh the round's figures, not the claims
    crash_point("aggregated", number)
    records = [agent_record(dict(update.record), size, session.transport.curve) for _, (update, size) in ordered]
    row = round_row(number, session.config.algorithm_name, current, missing, received, extra, records)
    if session.evaluator is None and session.rows.due(number):  # the agents' evaluations, in their updates
        row.update(agents_metrics([u for _, u in received]))
    ids = {i: session.registry.by_index(i).client_id for i in [*current.updates, *current.unavailable,
                                                                 *current.refused]}
    session.run_dir.append_jsonl("clients.jsonl", *client_rows(number, current, ids, records,
                                                            attribute_energy(records), bounds))
    ids.update({i: session.registry.by_index(i).client_id for i in current.bytes_down})
    session.tallies.note_round(number, ids, current.bytes_down, {i: size for i, (_, size) in ordered},
                            current.unavailable)
    row["wall_s"] = time.monotonic() - started
    if session.simulated_clock:
        row["sim_time_s"] = session.clock()
    crash_point("clients", number)
    held = session.hold_row(row, number)  # written when its evaluation is done, beside the next round
    session.bytes_total["down"] += int(row["bytes_down"])
    session.bytes_total["up"] += int(row["bytes_up"])
    crash_point("metrics", number)
    # the round is now the last committed one: its checkpoint is written (crash point 'checkpoint'), then the
    # Commits go out, in the order the protocol gives
    session.act(session.protocol.commits(number))
    if session.secagg is not None:
        session.secagg.close()
    session.spent["tail_s"] = time.monotonic() - session.last_accepted
    held.row.update(session.spent, checkpoint_s=session.checkpoint_s)
    crash_point("committed", number)  # the row may still wait for its evaluation: the checkpoint holds it
    if not held.waiting:
        session.rows.flush()
    session.round_walls.append(row["wall_s"])
    return row
