"""Fedge's coordinator: its configuration, THE round loop (``session``), the ZeroMQ ROUTER transport, the run
directory and what goes into it (rows, checkpoints, status, evaluation). It drives ``fedge.protocol``'s
coordinator side and knows nothing of the agent; the ``coordinator`` command and the composition of a session live
in ``fedge.runtime``."""
