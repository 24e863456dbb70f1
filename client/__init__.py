"""The client side of a federated round, shared by a real edge agent and a simulated fleet's workers.

``protocol`` (the agent's half of the round protocol, no I/O), ``joining`` (a session built from a welcome),
``data`` (a device's own data), ``state`` (device state, committed in two phases), ``metering`` (what the meter is
told about a round's masks), ``round`` (THE client-round function: a task in, an update out). Never a transport, a
socket or a thread: the drivers (``fedge.edge_agent``, ``fedge.simulation``) own those.
"""
