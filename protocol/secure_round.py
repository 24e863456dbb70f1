"""A securely aggregated round on the coordinator's side, with no I/O: the stages of ``secagg.aggregator`` driven by
the agents' codec messages and the clock (docs/secure-aggregation.md).

``SecureRound`` answers each stage's message (``receive``: SecAggKeys, SecAggShares, SecAggReveal) and closes a
stage when every device it waits for has answered or its deadline (``stage_timeout_s`` after the stage opened) has
passed (``tick``): the keys stage sends every device that advertised the roster, the shares stage sends each device
that shared its delivery. The masked inputs arrive in Updates (``masked``); the driver closes that stage when the
round's update stage ends (``close_inputs``), and every survivor is sent the unmask request. The unmask stage ends
with the sum (``total``, the survivors in ``contributors``) or, with too few answers by its deadline, a failed
round (``failed``, with its reason): the sum is never partial. A message of a stage that has closed, from a device
the stage does not wait for, or that the stage refuses, is answered with nothing and noted. Devices are named by
client id; ``peer_of`` gives the routing id of each (None: gone). No sockets, threads or clocks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from fedge import codec
from fedge.protocol.events import COORDINATOR, CoordinatorEvent, Noted, Send
from fedge.protocol.secure_device import masked_words
from fedge.secagg.aggregator import RoundFailed, RoundStage, SecAggRound, SecureSum
from fedge.secagg.device import SHARE_CHUNKS
from fedge.secagg.field import U64
from fedge.secagg.messages import Keys, MaskedInput, SealedShare, Setup, Shares, UnmaskShares
from fedge.secagg.shamir import from_bytes


class SecureRound:
    """See the module docstring."""

    def __init__(self, run_id: str, number: int, attempt: int, setup: Setup, selected: list[str],
                 peer_of: Callable[[str], bytes | None], stage_timeout_s: float, now: float, release: int = 0) -> None:
        self.run_id, self.number, self.attempt = run_id, number, attempt
        self.release = release  # under distributed noise: the fewest inputs whose sum may be unmasked
        self.setup = setup
        self.machine = SecAggRound(setup, selected)
        self.peer_of = peer_of
        self.stage_timeout_s = stage_timeout_s
        self.deadline = now + stage_timeout_s
        self.waiting: set[str] = set(selected)  # who the open stage waits for
        self.result: SecureSum | None = None

    @property
    def stage(self) -> RoundStage:
        return self.machine.stage

    @property
    def failed(self) -> str:
        return self.machine.reason if self.machine.stage is RoundStage.FAILED else ""

    @property
    def done(self) -> bool:
        return self.machine.stage in (RoundStage.SUMMED, RoundStage.FAILED)

    def receive(self, client_id: str, message: codec.Message, now: float) -> list[CoordinatorEvent]:
        attempt = getattr(message, "attempt", None)
        if message.run_id != self.run_id or message.round != self.number or attempt != self.attempt:
            # an earlier round's or attempt's is an honest device late; another run's or a later one's, no honest
            # device sends: the device is named in a warning
            late = message.run_id == self.run_id and isinstance(attempt, int) and \
                (message.round, attempt) < (self.number, self.attempt)
            return [Noted(logging.INFO if late else logging.WARNING,
                          f"secure aggregation: a {type(message).__name__} from {client_id} of another run, round or "
                          f"attempt (round {message.round}, attempt {attempt}; this is round {self.number}, attempt "
                          f"{self.attempt}): ignored")]
        match message:
            case codec.SecAggKeys():
                reason = self.machine.add_keys(Keys(client_id, message.channel_key, message.masking_key,
                                                    message.seed_digest))
            case codec.SecAggShares():
                reason = self.machine.add_shares(Shares(client_id, tuple(
                    SealedShare(client_id, receiver, sealed) for receiver, sealed in message.shares)))
            case codec.SecAggReveal():
                try:
                    reason = self.machine.add_unmask(UnmaskShares(
                        client_id, seeds={device: from_bytes(data, SHARE_CHUNKS) for device, data in message.seeds},
                        secrets={device: from_bytes(data, SHARE_CHUNKS) for device, data in message.secrets}))
                except ValueError as error:
                    reason = str(error)
            case _:
                reason = f"a {type(message).__name__} is not a secure-aggregation answer"
        if reason:
            return [Noted(logging.WARNING, f"secure aggregation, round {self.number}: refused from {client_id}: "
                                           f"{reason}")]
        self.waiting.discard(client_id)
        return self.advance(now) if not self.waiting else []

    def masked(self, client_id: str, words: U64) -> str:
        """A masked input: '' when it joined the sum, else why not."""
        return self.machine.add_masked(MaskedInput(client_id, words))

    def masked_update(self, client_id: str, update: codec.Update) -> str:
        """An Update's masked input (``protocol.secure_device.masked_group``): '' when it joined the sum, else why
        not (the Update is then refused)."""
        words, problem = masked_words(update.groups, self.setup.size, self.setup.bits)
        return problem if words is None else self.masked(client_id, words)

    def gone(self, client_id: str, now: float) -> list[CoordinatorEvent]:
        """A device left or failed its round: the open stage no longer waits for it (it closes now when it waited
        for no one else)."""
        self.machine.withdraw(client_id)  # during the keys stage: left out of the roster
        if client_id not in self.waiting:
            return []
        self.waiting.discard(client_id)
        return self.advance(now) if not self.waiting else []

    def inputs_complete(self) -> bool:
        """Every device that shared has sent its masked input."""
        return self.machine.stage is RoundStage.INPUTS and self.machine.masked == set(self.machine.sealed)

    def close_inputs(self, now: float) -> list[CoordinatorEvent]:
        """The round's update stage has ended: the unmask requests go out (or, when it ended before the shares were
        delivered, the round fails)."""
        stage = self.machine.stage
        if stage in (RoundStage.KEYS, RoundStage.SHARES):
            self.waiting = set()
            try:
                self.machine.fail(f"the round's updates closed in the {stage.value} stage, before any masked "
                                  "input could come")
            except RoundFailed as failure:
                return [Noted(logging.WARNING, f"secure aggregation, round {self.number}: the round fails: "
                                               f"{failure}")]
        if stage is not RoundStage.INPUTS:
            return []
        return self.advance(now)

    def tick(self, now: float) -> list[CoordinatorEvent]:
        """Close the keys, shares or unmask stage whose deadline has passed."""
        if self.machine.stage in (RoundStage.KEYS, RoundStage.SHARES, RoundStage.UNMASK) and now >= self.deadline:
            return self.advance(now)
        return []

    def advance(self, now: float) -> list[CoordinatorEvent]:
        """Close the open stage and open the next, with what it sends."""
        try:
            return self.next_stage(now)
        except RoundFailed as failure:
            self.waiting = set()
            return [Noted(logging.WARNING, f"secure aggregation, round {self.number}: the round fails: {failure}")]

    def next_stage(self, now: float) -> list[CoordinatorEvent]:
        stage = self.machine.stage
        self.deadline = now + self.stage_timeout_s
        if stage is RoundStage.KEYS:
            roster = self.machine.close_keys()
            keys = tuple((entry.device, entry.channel, entry.masking) for entry in roster.keys)
            self.waiting = {entry.device for entry in roster.keys}
            return self.to_each(self.waiting, lambda _: codec.SecAggRoster(
                self.run_id, self.number, COORDINATOR, attempt=self.attempt, keys=keys))
        if stage is RoundStage.SHARES:
            deliveries = self.machine.close_shares()
            self.waiting = set()  # the masked inputs come in Updates, until the round's update stage ends
            return self.to_each(set(deliveries), lambda device: codec.SecAggDelivery(
                self.run_id, self.number, COORDINATOR, attempt=self.attempt,
                shares=tuple((s.sender, s.sealed) for s in deliveries[device].shares)))
        if stage is RoundStage.INPUTS:
            request = self.machine.close_inputs()
            if len(request.survivors) < self.release:
                self.machine.fail(f"{len(request.survivors)} masked inputs, fewer than the {self.release} whose noise "
                                  "shares make the sum private: not unmasked")
            self.waiting = set(request.survivors)
            return self.to_each(self.waiting, lambda _: codec.SecAggUnmask(
                self.run_id, self.number, COORDINATOR, attempt=self.attempt, survivors=request.survivors,
                dropped=request.dropped))
        if stage is RoundStage.UNMASK:
            self.result = self.machine.finish()
            self.waiting = set()
            return [Noted(logging.INFO, f"secure aggregation, round {self.number}: the sum of "
                                        f"{len(self.result.contributors)} masked inputs is unmasked")]
        return []

    def to_each(self, devices: set[str], message_for: Callable[[str], codec.Message]) -> list[CoordinatorEvent]:
        events: list[CoordinatorEvent] = []
        for device in sorted(devices):
            peer = self.peer_of(device)
            if peer is not None:
                events.append(Send(message_for(device), peer=peer))
        return events

    @property
    def contributors(self) -> tuple[str, ...]:
        return self.result.contributors if self.result is not None else ()

    def total(self) -> U64 | None:
        return self.result.words if self.result is not None else None


def peers_by_id(agents: Mapping[str, bytes]) -> Callable[[str], bytes | None]:
    """``peer_of`` over a fixed map of client id to routing id (tests, a simulated fleet)."""
    return agents.get
