"""What a simulated fleet's worker does with one task: a logical client rebuilt from its files, trained, its update.

``train_client`` is self-contained, so any worker (the coordinator's own process, a pool process, a Ray actor on
another node) can train any client: it gets the client's Welcome and Task packets as bytes and the paths of the
client's shard and state directory, joins the session as an agent would (``client.joining``: the same checks and
the same model built from the session seed), plays THE client-round function (``client.round.play_task``: the
committed device state loaded, trained, the round's state written as pending, with what ``edge-agent predict``
needs beside the weights, as an agent writes it) and returns the Update packet. Its
state is committed by the fleet when the coordinator's Commit arrives (``client.state``, two phases as on a
device). One torch thread, as an agent trains (thread counts change bits). Knows no transport and no algorithm by
name.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from fedge import codec
from fedge.client.data import DeviceData
from fedge.client.joining import Refused, inference_meta, join_session
from fedge.client.round import play_task, update_frame
from fedge.client.state import DeviceState
from fedge.plumbing.forking import ParentState
from fedge.plumbing.threads import one_blas_thread
from fedge.protocol.events import Outcome

log = logging.getLogger("fedge.simulation")


@dataclass(frozen=True)
class ClientFiles:
    """A logical client: its id, its shard and its device-state directory."""

    client_id: str
    shard: str
    state_dir: str


@dataclass(frozen=True)
class WorkerRule:
    """The plugin rule of a simulated client (``client.joining.PluginRule``): the session's own plugins."""

    allow_plugins: tuple[str, ...] = ()
    allow_plugin_mismatch: bool = False


@dataclass(frozen=True)
class Job:
    """One task for one client, as the fleet hands it to a worker; ``max_steps``: the device's work budget for it
    (an agent's ``agent.max_steps``; 0: none)."""

    client: ClientFiles
    welcome: bytes
    task: bytes
    rule: WorkerRule = field(default_factory=WorkerRule)
    max_steps: int = 0


def failed(job: Job, reason: str) -> Outcome:
    """The outcome of a job that never reached (or never came back from) a worker."""
    task = codec.decode(job.task)
    return Outcome(task.round, None, reason, job.client.client_id)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_client(job: Job) -> Outcome:
    """Train ``job``'s task as its client; a failure is an Outcome with its reason, never an exception."""
    task = codec.decode(job.task)
    if not isinstance(task, codec.Task):
        return Outcome(0, None, f"not a task: {type(task).__name__}", job.client.client_id)
    try:
        welcome = codec.decode(job.welcome)
        if not isinstance(welcome, codec.Welcome):
            raise ValueError(f"not a welcome: {type(welcome).__name__}")
        with one_torch_thread():
            data = DeviceData.open(job.client.shard)
            session, tensors = join_session(job.rule, data, torch.device("cpu"), welcome)
            state = DeviceState(job.client.state_dir)
            budget = job.max_steps
            result = play_task(session, tensors, state, task, inference_meta=inference_meta(session, data),
                               spent=(lambda steps: steps >= budget) if budget > 0 else None)
        return Outcome(task.round, update_frame(session, job.client.client_id, result), client_id=job.client.client_id)
    except Refused as refusal:
        return Outcome(task.round, None, f"{refusal.code}: {refusal}", job.client.client_id)
    except Exception as exc:  # a failed round is reported, never fatal for the worker
        log.exception("client %s: round %d failed", job.client.client_id, task.round)
        return Outcome(task.round, None, f"{type(exc).__name__}: {exc}", job.client.client_id)


def forked_worker_setup(parent: ParentState) -> None:
    """A forked worker process's start: its starter's directory, path and environment (the server it was forked
    from may be older than they are), then ``worker_setup``."""
    parent.adopt()
    worker_setup()


def worker_setup() -> None:
    """A worker process's start: one thread for every numeric library, as an agent process has."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    torch.set_num_threads(1)
    one_blas_thread()
