"""Every rule of the coordinator's side of the round protocol, on the protocol object itself: frames and times in,
events out; no sockets, no processes. The server half is FedAvg's (or DSSA's, for masks) on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest

from fedge import codec
from fedge.protocol.coordinator import Noted, RejectionLimiter, Send, SendFrame
from tests.coordinator_frames import HASH, codes, frame, hello, joined, protocol, sent, update


def test_hello_first_and_the_sender_must_be_the_connection() -> None:
    p = protocol()
    heartbeat = frame(codec.Heartbeat(run_id="run-1", round=0, sender="a"))
    assert codes(p.receive(b"a", heartbeat, 0.0)) == ["hello-first"]
    assert codes(p.receive(b"b", hello("a"), 0.0)) == ["sender-mismatch"]
    assert p.registry.get("a") is None
    joined(p, "a")
    assert isinstance(sent(p.receive(b"a", heartbeat, 0.1))[0], codec.Heartbeat)


def test_a_full_session_and_mismatched_protocols_and_models_are_refused() -> None:
    p = protocol(capacity=1)
    joined(p, "a")
    assert codes(p.receive(b"b", hello("b"), 0.0)) == ["session-full"]
    assert codes(p.receive(b"c", hello("c", versions=(codec.PROTOCOL_VERSION + 1,)), 0.0)) == \
        ["protocol-mismatch"]
    older = bytearray(hello("e"))
    older[4] = 2  # a version-2 agent: answered in version 2, which it can read
    (answer,) = [e for e in p.receive(b"e", bytes(older), 0.0) if isinstance(e, SendFrame)]
    assert answer.peer == b"e" and answer.frame[:8] == b"FEDG\x02\x07\x00\x00" and b"protocol-mismatch" in \
        codec.frames.decompress(answer.frame[8:], max_size=1 << 16, where="t", need_checksum=True)
    older[4] = 3  # a version-3 agent: answered in version 3
    (answer,) = [e for e in p.receive(b"f", bytes(older), 0.0) if isinstance(e, SendFrame)]
    assert answer.frame == codec.version3_error("run-1", "coordinator", "protocol-mismatch",
                                                "the agent speaks wire-format version 3, this coordinator 4: "
                                                "upgrade the agent")
    assert codes(p.receive(b"d", hello("d", model_hash="0" * 16), 0.0)) == ["model-mismatch"]
    assert sorted(p.registry.agents) == ["a"]


def test_a_malformed_frame_is_refused_and_serving_goes_on() -> None:
    p = protocol()
    assert codes(p.receive(b"x", b"\x00junk", 0.0)) == ["malformed"]
    joined(p, "a")


def test_a_re_hello_mid_round_resends_the_task_only_to_an_agent_that_holds_none() -> None:
    p = protocol()
    joined(p, "a", "b")
    tasks = sent(p.open_round(1, [0, 1], 0.0, 30.0))
    assert [type(m) for m in tasks] == [codec.Task, codec.Task]
    holding = hello("a", holds=("run-1", 1))
    assert [type(m) for m in sent(p.receive(b"a", holding, 1.0))] == [codec.Welcome]
    stale_claim = hello("a", holds=("run-0", 1))  # a task of another run is not this one
    assert [type(m) for m in sent(p.receive(b"a", stale_claim, 1.0))] == [codec.Welcome, codec.Task]
    assert [type(m) for m in sent(p.receive(b"b", hello("b"), 1.0))] == [codec.Welcome, codec.Task]
    p.receive(b"b", update(p, "b", 1), 2.0)
    assert [type(m) for m in sent(p.receive(b"b", hello("b"), 3.0))] == [codec.Welcome]  # it already reported


def test_stale_not_selected_and_duplicate_updates_are_refused() -> None:
    p = protocol()
    joined(p, "a", "b", "c")
    assert codes(p.receive(b"a", update(p, "a", 1), 0.0)) == ["stale"]  # no round open
    p.open_round(1, [0, 1], 0.0, 30.0)
    assert codes(p.receive(b"a", update(p, "a", 2), 0.0)) == ["stale"]
    assert codes(p.receive(b"c", update(p, "c", 1), 0.0)) == ["not-selected"]
    assert codes(p.receive(b"a", update(p, "a", 1), 0.0)) == []
    assert codes(p.receive(b"a", update(p, "a", 1, shift=0.2), 0.0)) == ["duplicate"]
    assert sorted(p.current.updates) == [0]  # type: ignore[union-attr]


def test_invalid_updates_are_refused_with_the_reason() -> None:
    """Each refusal ends the device's part in the round at once (a second update of it is a duplicate)."""
    arrays = protocol().server.evaluation_arrays()
    name = next(iter(arrays))
    nan = {k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v for k, v in arrays.items()}
    cases = {
        ("invalid-update", "unknown tensor"): {"model": codec.TensorGroup(dense={"nope.weight": np.zeros(3, np.float32)})},
        ("invalid-update", "shape"): {"model": codec.TensorGroup(dense={name: np.zeros((1, 1), np.float32)})},
        ("malformed", "NaN"): {"model": codec.TensorGroup(dense=nan)},
    }
    for (code, expected), groups in cases.items():
        p = protocol()
        joined(p, "a")
        p.open_round(1, [0], 0.0, 30.0)
        events = p.receive(b"a", update(p, "a", 1, groups=groups), 0.0)
        assert codes(events) == [code] and expected in sent(events)[0].reason  # type: ignore[attr-defined]
        assert p.current.updates == {} and p.complete(0.0)  # type: ignore[union-attr]
        assert codes(p.receive(b"a", update(p, "a", 1), 0.0)) == ["duplicate"]


def test_masked_values_must_be_bound_to_a_mask_sent_this_round() -> None:
    p = protocol(algorithm="dssa-fedavg", options={"warmup_rounds": 0, "sparsity": 0.5})
    joined(p, "a", "b")
    task, _ = sent(p.open_round(1, [0, 1], 0.0, 30.0))
    assert p.current.masks[0]  # type: ignore[union-attr]
    sparse = next(g.sparse for g in task.groups.values() if g.sparse is not None)  # type: ignore[attr-defined]
    other = ~sparse.mask
    values = np.zeros(int(other.sum()), np.float32)
    foreign = codec.SparseSection.masked_values(sparse.names, sparse.shapes, other, values, select=True)
    rest = {n: a for n, a in p.server.evaluation_arrays().items() if n not in sparse.names}  # the dense tensors
    events = p.receive(b"a", update(p, "a", 1, groups={"model": codec.TensorGroup(rest, foreign)}), 0.0)
    assert codes(events) == ["invalid-update"] and "not sent this round" in sent(events)[0].reason  # type: ignore[attr-defined]
    bound = codec.SparseSection.masked_values(sparse.names, sparse.shapes, sparse.mask,
                                              np.zeros(int((~sparse.mask).sum()), np.float32))
    assert codes(p.receive(b"b", update(p, "b", 1, groups={"model": codec.TensorGroup(rest, bound)}), 0.0)) == []


def test_commits_go_only_to_the_agents_whose_updates_were_aggregated() -> None:
    p = protocol()
    joined(p, "a", "b", "c")
    p.open_round(1, [0, 1, 2], 0.0, 30.0)
    p.receive(b"a", update(p, "a", 1), 1.0)
    p.receive(b"c", update(p, "c", 1), 1.0)
    assert not p.complete(1.0) and p.complete(31.0)  # b is awaited until the deadline
    closed, cancels = p.close_round(31.0)
    (cancel,) = cancels  # b, still training, is told to stop
    assert isinstance(cancel, Send) and cancel.peer == b"b" and isinstance(cancel.message, codec.Cancel) and \
        cancel.message.round == 1
    # a's round time was measured (1 s); b's is censored: twice the 31 s it had, at most the 30 s deadline
    assert p.registry.agents["a"].round_s == 1.0 and p.registry.agents["b"].round_s == 30.0
    with pytest.raises(RuntimeError):
        p.commits(2)
    commits = [e for e in p.commits(closed.number) if isinstance(e, Send)]
    assert [e.peer for e in commits] == [b"a", b"c"] and p.round == 1
    assert all(isinstance(e.message, codec.Commit) and e.message.round == 1 for e in commits)
    with pytest.raises(RuntimeError):
        p.commits(1)  # once


def test_a_bye_in_each_state() -> None:
    p = protocol()
    bye = frame(codec.Bye(run_id="run-1", round=0, sender="a", code="stopping", reason="agent stopping"))
    assert codes(p.receive(b"a", bye, 0.0)) == ["hello-first"]  # before registering
    joined(p, "a", "b", "c")
    p.receive(b"a", bye, 0.0)  # idle
    assert not p.registry.get("a").connected and p.current is None  # type: ignore[union-attr]
    joined(p, "a")
    p.open_round(1, [0, 1, 2], 0.0, 30.0)
    p.receive(b"b", update(p, "b", 1), 1.0)
    p.receive(b"b", frame(codec.Bye(run_id="run-1", round=1, sender="b", code="stopping", reason="agent stopping")),
              1.0)
    p.receive(b"a", bye, 1.0)  # selected and still training: no longer awaited
    assert p.current.failed == {0} and 1 in p.current.updates  # type: ignore[union-attr]
    assert not p.complete(1.0)  # c is still awaited
    p.receive(b"c", frame(codec.Bye(run_id="run-1", round=1, sender="c", code="stopping", reason="agent stopping")),
              1.0)
    assert p.complete(1.0)
    assert codes(p.receive(b"a", update(p, "a", 1), 1.0)) == ["hello-first"]  # gone means gone


def test_a_round_closes_when_every_awaited_agent_is_gone() -> None:
    p = protocol(liveness_s=5.0)
    joined(p, "a", "b", now=0.0)
    p.open_round(1, [0, 1], 0.0, 300.0)
    p.receive(b"a", update(p, "a", 1), 1.0)
    assert not p.complete(4.0) and p.complete(6.0)  # b not heard from for longer than liveness


def test_an_update_beyond_the_target_in_the_batch_that_closes_the_round_is_refused() -> None:
    """Over-selection: the driver checks ``complete`` after each batch of frames, so a third update may come in
    the batch that brought the second; the target is what the round aggregates, so it is refused as stale."""
    p = protocol()
    joined(p, "a", "b", "c")
    p.open_round(1, [0, 1, 2], 0.0, 300.0, target=2)
    for name in ("a", "b"):
        assert codes(p.receive(name.encode(), update(p, name, 1), 1.0)) == []
    assert codes(p.receive(b"c", update(p, "c", 1), 1.0)) == ["stale"]
    assert sorted(p.current.updates) == [0, 1] and p.complete(1.0)  # type: ignore[union-attr]


def test_an_agent_that_declines_after_its_update_was_accepted_keeps_its_index_for_the_round() -> None:
    """Its update is in the round (its records, its commit): its index is not freed, so the round closes and
    commits as usual (freeing it crashed the session's records with a KeyError, found in review)."""
    p = protocol()
    joined(p, "a", "b")
    p.open_round(1, [0, 1], 0.0, 30.0)
    p.receive(b"a", update(p, "a", 1), 1.0)
    declined = frame(codec.ErrorMessage(run_id="", round=0, sender="a", code="bad-welcome", reason="no"))
    p.receive(b"a", declined, 1.5)
    assert p.registry.get("a") is not None and p.registry.by_index(0).client_id == "a"
    p.receive(b"b", update(p, "b", 1), 2.0)
    state, _ = p.close_round(2.0)
    assert sorted(state.updates) == [0, 1]
    assert [m.sender for m in sent(p.commits(1)[1:])] == ["coordinator", "coordinator"]


def test_a_failed_round_and_a_declined_session() -> None:
    p = protocol(capacity=2)
    joined(p, "a", "b")
    p.open_round(1, [0, 1], 0.0, 30.0)
    failed = frame(codec.ErrorMessage(run_id="run-1", round=1, sender="a", code="round-failed", reason="OOM"))
    assert [type(e) for e in p.receive(b"a", failed, 1.0)] == [Noted]
    assert p.current.failed == {0}  # type: ignore[union-attr]
    declined = frame(codec.ErrorMessage(run_id="", round=0, sender="b", code="plugin-refused", reason="no"))
    p.receive(b"b", declined, 1.0)
    assert p.registry.get("b") is None and p.complete(1.0)
    joined(p, "c")
    assert p.registry.get("c").index == 1  # type: ignore[union-attr]


def test_with_curve_a_connection_is_only_the_client_its_key_is_allowed_as() -> None:
    p = protocol(capacity=3)
    impostor = p.receive(b"a", hello("a"), 0.0, identity="b")  # b's key, claiming a's id
    assert codes(impostor) == ["identity-mismatch"] and p.registry.get("a") is None
    assert "allowed as client 'b', not as 'a'" in sent(impostor)[0].reason  # type: ignore[attr-defined]
    assert isinstance(sent(p.receive(b"b", hello("b"), 0.0, identity="b"))[0], codec.Welcome)
    beat = frame(codec.Heartbeat(run_id="run-1", round=0, sender="b"))
    assert codes(p.receive(b"b", beat, 1.0, identity="c")) == ["identity-mismatch"]
    assert codes(p.receive(b"b", beat, 1.0, identity="b")) == []
    claim = p.receive(b"c", hello("a"), 1.0, identity="c")  # the transport names c's key; the hello claims a
    assert codes(claim) == ["identity-mismatch"] and "allowed as client 'c', not as 'a'" in sent(claim)[0].reason  # type: ignore[attr-defined]
    assert isinstance(sent(p.receive(b"a", hello("a"), 0.0))[0], codec.Welcome)  # CurveZMQ off: no identity


def test_an_agent_that_declined_is_not_selected_again_until_a_heartbeat_shows_it_joined() -> None:
    p = protocol(capacity=2)
    joined(p, "a")
    declined = frame(codec.ErrorMessage(run_id="", round=0, sender="b", code="plugin-refused", reason="no"))
    joined(p, "b")
    p.receive(b"b", declined, 1.0)
    joined(p, "b")  # it says hello again (and will decline again): welcomed, but not a live client
    assert p.registry.get("b").connected and p.registry.live_indices(2.0) == [0]  # type: ignore[union-attr]
    other_run = frame(codec.Heartbeat(run_id="run-0", round=0, sender="b"))
    p.receive(b"b", other_run, 2.0)
    assert p.registry.live_indices(2.0) == [0]
    p.receive(b"b", frame(codec.Heartbeat(run_id="run-1", round=0, sender="b")), 2.0)
    assert p.registry.live_indices(2.0) == [0, 1]  # its welcome took this time
    for i in range(300):  # the memory of declines stays bounded
        p.receive(f"x{i}".encode(), hello(f"x{i}"), 3.0)
        p.receive(f"x{i}".encode(), frame(codec.ErrorMessage(run_id="", round=0, sender=f"x{i}",
                                                            code="plugin-refused", reason="no")), 3.0)
    assert len(p.declined) <= 4 * 2 + 64


def test_a_peer_that_keeps_sending_junk_is_answered_a_few_times_per_window() -> None:
    p = protocol()
    p.limiter = RejectionLimiter(burst=5, window_s=10.0, peers=4)
    answered = sum(len(codes(p.receive(b"junk", b"\x01" * 16, t * 0.001))) for t in range(1000))
    assert answered == 5 and p.limiter.totals[b"junk"] == 1000
    later = p.receive(b"junk", b"\x01" * 16, 20.0)
    notes = [e.text for e in later if isinstance(e, Noted)]
    assert notes == ["995 more rejections of b'junk' were not answered or logged in the last window"]
    assert codes(later) == ["malformed"]
    for i in range(10):  # the table stays bounded
        p.receive(f"p{i}".encode(), b"\x01", 30.0)
    assert len(p.limiter.table) == 4
    joined(p, "a")  # and serving goes on


def test_the_welcome_and_the_task_carry_typed_session_and_round_fields() -> None:
    p = protocol()
    p.task_flags = lambda number: {"personal_eval": number == 1, "evaluate": False}
    (welcome,) = sent(p.receive(b"a", hello("a"), 0.0))
    assert isinstance(welcome, codec.Welcome) and welcome.client_index == 0 and welcome.model_hash == HASH
    assert welcome.train["optimizer"] == "sgd" and welcome.algorithm == "fedavg"
    (task,) = sent(p.open_round(1, [0], 10.0, 30.0))
    assert isinstance(task, codec.Task) and (task.committed_round, task.last_accepted_round) == (0, 0)
    assert task.deadline_s == 30.0 and task.personal_eval and not task.evaluate and not task.paced
    assert task.meta == {}  # FedAvg's downlink has no meta of its own: the runtime's fields are not in it


def test_an_agent_cannot_send_what_only_a_coordinator_sends() -> None:
    p = protocol()
    joined(p, "a")
    for message in (codec.Commit(run_id="run-1", round=1, sender="a"),
                    codec.Cancel(run_id="run-1", round=1, sender="a", reason="x"),
                    codec.Grant(run_id="run-1", round=1, sender="a")):
        assert codes(p.receive(b"a", frame(message), 0.0)) == ["unexpected"]


def test_a_finished_session_answers_no_hello_and_another_runs_updates_are_refused() -> None:
    p = protocol()
    joined(p, "a")
    p.open_round(1, [0], 0.0, 30.0)
    foreign = frame(codec.Update(run_id="run-0", round=1, sender="a", num_samples=10))
    events = p.receive(b"a", foreign, 1.0)
    assert codes(events) == ["stale"] and "this session is run 'run-1'" in sent(events)[0].reason  # type: ignore[attr-defined]
    stale_failure = frame(codec.ErrorMessage(run_id="run-0", round=1, sender="a", code="round-failed", reason="x"))
    p.receive(b"a", stale_failure, 1.0)
    assert p.current.failed == set()  # type: ignore[union-attr]
    p.abandon_round()
    p.byes("finished", "session finished")
    assert p.receive(b"b", hello("b"), 2.0) == []


def test_a_sparse_only_upload_is_refused_where_the_aggregate_reads_dense_tensors() -> None:
    p = protocol()
    joined(p, "a")
    p.open_round(1, [0], 0.0, 30.0)
    arrays = p.server.evaluation_arrays()
    names = list(arrays)
    section = codec.SparseSection.with_indices(names, [arrays[n].shape for n in names], np.array([0, 1]),
                                               np.ones(2, np.float32))
    events = p.receive(b"a", update(p, "a", 1, groups={"model": codec.TensorGroup(sparse=section)}), 1.0)
    assert codes(events) == ["invalid-update"] and "sparse section" in sent(events)[0].reason  # type: ignore[attr-defined]


def test_a_meter_record_with_a_word_where_a_figure_belongs_is_dropped_not_fatal() -> None:
    from fedge.coordinator.rows import agent_record, meter_totals

    assert agent_record({"cpu_s": "x", "energy_j": 1.0}, 100, False) == {}
    assert agent_record({"cpu_s": float("inf")}, 100, False) == {}
    kept = agent_record({"cpu_s": 1.5, "energy_source": "rapl"}, 100, False)
    assert kept["cpu_s"] == 1.5 and kept["bytes_payload_up"] == 100
    assert meter_totals([kept, agent_record({"cpu_s": "x"}, 50, False)])["cpu_s"] is None  # no crash
