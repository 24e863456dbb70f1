"""Fedge's coordinator: CLI, configuration, THE round loop, the ZeroMQ ROUTER transport, checkpoints, local fleet."""
