"""The round protocol, with no I/O: what the coordinator and an agent each decide on every message and tick.

Its modules, in reading order:

- ``payload``: what a round carries between the runtime and an algorithm (``Payload``, ``ClientUpdate``).
- ``server_half``: what the runtime calls on a server half, and the one aggregation path (``Aggregation``).
- ``influence``, ``robust_rules``: bounded influence (the weight cap, the norm bound, quarantine) and the robust
  aggregation rules the path applies (docs/robustness.md).
- ``privacy``, ``exact_sum``, ``server_step``: differential privacy's clip, noise, adaptive clip and private draws
  (docs/privacy.md), the order-independent exact sums every fold builds on, and the server's optimizer step.
- ``events``: the one set of events and actions the two protocol objects hand their drivers.
- ``round``: the coordinator's round as named states (``RoundPhase``, ``ClientOutcome``) and ``RoundState``.
- ``registry``, ``limiter``, ``pacing``, ``selection``, ``validation``: the coordinator's agent registry, its
  bounded rejection counter, upload pacing, selection policies and round-time estimates, and update checks.
- ``coordinator``: ``CoordinatorProtocol``, the coordinator's side.
- ``agent``: ``AgentProtocol``, an agent's side, with its named states (``AgentState``).

Pure all the way down: importing any of these loads the codec, numpy and these modules, never torch, zmq,
subprocess, asyncio, threads, the meter or run-directory code, and nothing here reads a clock (the time comes in
as an argument). tests/test_imports.py checks it in a fresh interpreter. Drivers (``coordinator.session``,
``edge_agent.agent``, ``simulation.fleet``, ``simulation.inprocess``) dispatch every event in one ``match`` ending in
``fedge.exhaustive.assert_never``, so mypy names a case a driver forgot.

How a later change lands here:

- **A state.** Add it to its enum and its rows to the transition table beside it (``round.ROUND_TRANSITIONS``,
  ``round.OUTCOME_TRANSITIONS``, ``agent.AGENT_TRANSITIONS``), and the table in that module's docstring; a state
  is entered only through the table's ``move``/``next_phase``.
- **A message.** Its frozen dataclass and kind in ``codec.messages`` (wire format: docs/wire-format.md, with a
  worked example), the rule that answers it in ``coordinator`` or ``agent`` (a ``case`` of ``receive``), and, if a
  driver must act on it, an event here in ``events`` and its ``case`` in every driver.
- **A header field.** Headers carry exactly the keys of their kind, so a field is a wire-format change: add it to
  the message's dataclass and to docs/wire-format.md within the release's one version (version 4 is this
  stage's), never as an optional key whose absence means something.
"""
