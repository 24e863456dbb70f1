"""A securely aggregated round recovered from its kept sum: the coordinator crashed after unmasking the round and
before its checkpoint (docs/secure-aggregation.md), so the round is applied as it was summed, never redone. A thin
step of ``coordinator.session.Session``'s loop, which it takes (typed loosely: the session module imports this
one, and the import graph has no cycles); no algorithm by name.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fedge.coordinator.config import ConfigError
from fedge.coordinator.rundir import METER_FIELDS, METRICS_FIELDS
from fedge.coordinator.secure import KeptSum
from fedge.protocol.server_half import Aggregation

log = logging.getLogger("fedge.coordinator")


def recover_round(session: Any, kept: KeptSum) -> dict[str, Any]:
    """Round ``kept.round`` as its kept sum says: the coordinator crashed after unmasking it, before its
    checkpoint. Its mean change is folded as it was, the round committed and checkpointed, and its row written
    from what was kept (``secagg_recovered``; no clients.jsonl rows: the devices' records were lost). Its
    contributors are named by client id (an index may have changed hands since the last checkpoint)."""
    number, started = kept.round, time.monotonic()
    session.rows.flush()
    session.aggregation = Aggregation(session.server, number, step=session.step)
    first = min(kept.contributors, key=lambda c: c[1])
    try:
        groups = kept.groups(session.server.downlink(number, first[1]).groups)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    session.aggregation.fold_secure_mean(groups, first, sorted(index for _, index in kept.contributors))
    extra = session.aggregation.close()
    for client_id, _ in kept.contributors:  # their next task confirms the round to them
        agent = session.registry.get(client_id)
        if agent is not None:
            agent.last_accepted_round = number
    session.protocol.resume(session.run_id, number)
    indices = sorted(index for _, index in kept.contributors)  # as they were in the round
    row: dict[str, Any] = dict.fromkeys(METRICS_FIELDS + METER_FIELDS)
    row.update(round=number, algorithm=session.config.algorithm_name, reported=len(indices), accepted=indices,
               selected_indices=indices, bytes_down=0, bytes_up=0, **extra, **kept.record, secagg_recovered=True)
    row["wall_s"] = time.monotonic() - started
    log.warning("round %d: recovered from the sum kept before the crash (%d masked inputs); not redone",
                number, len(indices))
    held = session.hold_row(row, number)
    session.save_checkpoint()
    if session.secagg is not None:
        session.secagg.drop_sum()
    if not held.waiting:
        session.rows.flush()
    return row
