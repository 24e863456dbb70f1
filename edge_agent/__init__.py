"""Fedge's edge agent: CLI, settings, the agent loop, the ZeroMQ DEALER transport, on-device state, systemd notify.

Runs on a Raspberry Pi or Jetson; reads only its own shard; never imports the coordinator's round loop.
"""
