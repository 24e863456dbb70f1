"""Secure aggregation (SecAgg+, Bonawitz et al. 2017, Bell et al. 2020): the coordinator learns the sum of a
round's inputs and nothing else. ``field`` (the integers mod 2^bits and how values are put on them), ``shamir``
(t-of-k sharing), ``keys`` (X25519, HKDF, ChaCha20 masks and sealed shares, all from ``cryptography``), ``graph``
(who shares with whom), ``messages`` (the four stages' messages), ``device`` and ``aggregator`` (each side's
state machine, no I/O). Imports nothing of Fedge outside this package, never torch or zmq; docs/secure-aggregation.md
describes the protocol and its threat model.
"""
