"""The coordinator's side of a securely aggregated round (``protocol.secure_round``), fed real packets: the stages
close when every device has answered or at their deadline, the sum comes out exact with devices lost at each
stage, and too few answers fail the round with its reason, never a partial sum."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedge import codec
from fedge.protocol.events import Send
from fedge.protocol.secure_round import SecureRound, peers_by_id
from fedge.secagg import field, shamir
from fedge.secagg.aggregator import RoundStage
from fedge.secagg.device import SecAggDevice
from fedge.secagg.keys import round_context, support_digest
from fedge.secagg.messages import Delivery, Keys, Roster, SealedShare, Setup, UnmaskRequest

BITS, SIZE, TIMEOUT = 16, 32, 5.0


def wire(message: codec.Message) -> codec.Message:
    return codec.decode(codec.encode(message))


class Device:
    """One agent's answers, each a real packet: its ``SecAggDevice`` behind codec messages."""

    def __init__(self, name: str, setup: Setup) -> None:
        self.name = name
        self.machine = SecAggDevice(name, setup)
        self.words = field.lift(np.random.default_rng(abs(hash(name)) % 1000).integers(-50, 51, SIZE), BITS)

    def keys(self) -> codec.Message:
        keys = self.machine.keys()
        return wire(codec.SecAggKeys("r1", 4, self.name, attempt=0, channel_key=keys.channel,
                                     masking_key=keys.masking, seed_digest=keys.seed_digest))

    def answer(self, message: codec.Message) -> codec.Message | None:
        match message:
            case codec.SecAggRoster():
                shares = self.machine.share(Roster(tuple(Keys(*entry) for entry in message.keys)))
                return wire(codec.SecAggShares("r1", 4, self.name, attempt=0,
                                               shares=tuple((s.receiver, s.sealed) for s in shares.shares)))
            case codec.SecAggDelivery():
                self.delivery = Delivery(tuple(SealedShare(sender, self.name, sealed) for sender, sealed in message.shares))
                return None
            case codec.SecAggUnmask():
                reveal = self.machine.unmask(UnmaskRequest(message.survivors, message.dropped))
                pack = shamir.to_bytes
                return wire(codec.SecAggReveal("r1", 4, self.name, attempt=0,
                                               seeds=tuple((d, pack(v)) for d, v in reveal.seeds.items()),
                                               secrets=tuple((d, pack(v)) for d, v in reveal.secrets.items())))
        raise AssertionError(message)

    def masked(self) -> field.U64:
        return self.machine.mask(self.delivery, self.words).words


def play(n: int, silent_keys: Sequence[int] = (), silent_shares: Sequence[int] = (),
         no_input: Sequence[int] = (), silent_reveal: Sequence[int] = ()
         ) -> tuple[SecureRound, dict[str, Device], float]:
    """A round of ``n`` devices, some silent at a stage; returns it, its devices and the time it took (every stage
    that waited for its deadline adds ``TIMEOUT``)."""
    setup = Setup(round_context("r1", 4, 0, support_digest(None, SIZE)), BITS, SIZE, 0.6, 50, 1)
    names = [f"a{i}" for i in range(n)]
    devices = {name: Device(name, setup) for name in names}
    peers = {name: name.encode() for name in names}
    secure = SecureRound("r1", 4, 0, setup, names, peers_by_id(peers), TIMEOUT, now=0.0)
    now = 0.0
    outbox: list[Send] = []

    def deliver(events: list[object]) -> None:
        outbox.extend(e for e in events if isinstance(e, Send))

    for i, name in enumerate(names):
        if i not in silent_keys:
            deliver(secure.receive(name, devices[name].keys(), now))
    if secure.stage is RoundStage.KEYS:
        now += TIMEOUT
        deliver(secure.tick(now))
    for stage_silent in (silent_shares, ()):
        sends, outbox[:] = list(outbox), []
        for send in sends:
            name = send.peer.decode()
            if names.index(name) in stage_silent:
                continue
            reply = devices[name].answer(wire(send.message))
            if reply is not None:
                deliver(secure.receive(name, reply, now))
        if secure.stage is RoundStage.SHARES:
            now += TIMEOUT
            deliver(secure.tick(now))
    for name in names:
        if secure.stage is RoundStage.INPUTS and hasattr(devices[name], "delivery") and names.index(name) not in no_input:
            assert secure.masked(name, devices[name].masked()) == ""
    deliver(secure.close_inputs(now))
    for send in list(outbox):
        name = send.peer.decode()
        if names.index(name) not in silent_reveal:
            deliver(secure.receive(name, devices[name].answer(wire(send.message)), now))  # type: ignore[arg-type]
    if not secure.done:
        now += TIMEOUT
        deliver(secure.tick(now))
    return secure, devices, now


def expected(secure: SecureRound, devices: dict[str, Device]) -> field.U64:
    total = np.zeros(SIZE, np.uint64)
    for name in secure.contributors:
        total = field.add(total, devices[name].words, BITS)
    return total


def test_every_device_answering_gives_the_exact_sum_without_waiting_for_a_deadline() -> None:
    secure, devices, took = play(6)
    total = secure.total()
    assert took == 0.0  # no stage waited for its deadline
    assert secure.stage is RoundStage.SUMMED and total is not None and len(secure.contributors) == 6
    assert np.array_equal(total, expected(secure, devices))


def test_devices_lost_at_each_stage_still_give_the_survivors_exact_sum() -> None:
    secure, devices, took = play(10, silent_keys=[0], silent_shares=[1], no_input=[2], silent_reveal=[3])
    assert took == 3 * TIMEOUT  # keys, shares and unmask each waited for the silent one
    total = secure.total()
    assert total is not None and set(secure.contributors) == {f"a{i}" for i in range(10)} - {"a0", "a1", "a2"}
    assert np.array_equal(total, expected(secure, devices))


def test_too_few_reveals_by_the_deadline_fail_the_round_with_its_reason() -> None:
    secure, _, _ = play(6, silent_reveal=[0, 1, 2])
    assert secure.stage is RoundStage.FAILED and secure.total() is None
    assert "too few unmask shares" in secure.failed


def test_a_message_of_another_attempt_or_a_late_one_is_noted_and_changes_nothing() -> None:
    setup = Setup(round_context("r1", 4, 0, support_digest(None, SIZE)), BITS, SIZE, 0.6, 50, 1)
    secure = SecureRound("r1", 4, 0, setup, ["a0", "a1", "a2"], peers_by_id({}), TIMEOUT, now=0.0)
    device = Device("a0", setup)
    keys = device.keys()
    other = codec.SecAggKeys("r1", 4, "a0", attempt=1, channel_key=keys.channel_key,  # type: ignore[attr-defined]
                             masking_key=keys.masking_key, seed_digest=keys.seed_digest)  # type: ignore[attr-defined]
    assert "another run, round or attempt" in secure.receive("a0", other, 0.0)[0].text  # type: ignore[union-attr]
    assert secure.machine.keys == {}
    secure.receive("a0", keys, 0.0)
    assert "sent its keys already" in secure.receive("a0", keys, 0.1)[0].text  # type: ignore[union-attr]


def test_a_stage_waits_for_its_deadline_and_then_fails_with_too_few_devices() -> None:
    setup = Setup(round_context("r1", 4, 0, support_digest(None, SIZE)), BITS, SIZE, 0.6, 50, 1)
    secure = SecureRound("r1", 4, 0, setup, ["a0", "a1", "a2"], peers_by_id({}), TIMEOUT, now=0.0)
    secure.receive("a0", Device("a0", setup).keys(), 0.0)
    assert secure.tick(TIMEOUT - 0.01) == [] and secure.stage is RoundStage.KEYS  # still waiting for a1, a2
    assert "1 device(s) advertised keys" in secure.tick(TIMEOUT)[0].text  # type: ignore[union-attr]
    assert secure.stage is RoundStage.FAILED and secure.done and secure.total() is None
