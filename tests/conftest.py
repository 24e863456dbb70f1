"""Shared fixtures: ``procs`` starts real processes for end-to-end tests and kills them all at teardown."""

from tests.e2e import procs

__all__ = ["procs"]
