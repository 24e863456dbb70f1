"""A simulated fleet's tasks trained by Ray actors (``fleet.backend = "ray"``; the optional extra ``fedge[ray]``).

``RayBackend`` keeps ``workers`` actors of one CPU each, hands each idle actor the next job and collects what
finished with ``ray.wait``. With ``fleet.ray_address`` it joins that cluster (its nodes need the same Fedge, torch and
Ray, and the run directory on a shared filesystem: docs/scale.md); without, ``start_local_ray`` starts a private one
on this machine: bound to 127.0.0.1, usage statistics off, no dashboard, a small object store and a short temporary
directory (Ray's Unix socket paths must stay under 107 bytes). Only ``ray.init`` and ``ray.shutdown``: never
``ray stop``, which kills every Ray process of the machine by name. An actor that dies fails its job with the
reason and is replaced. Imported only when chosen; knows no algorithm and no coordinator.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import tempfile
import time
from typing import Any

from fedge.protocol.events import Outcome
from fedge.simulation.worker import Job, failed, train_client, worker_setup

log = logging.getLogger("fedge.simulation")

OBJECT_STORE_BYTES = 256 << 20
_local_dirs: list[str] = []  # the temporary directories of the private clusters this process started


def ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError("fleet.backend = \"ray\" needs Ray: pip install 'fedge[ray]' (with the constraints file "
                           "constraints/ray.txt)") from None
    return ray


def start_local_ray(num_cpus: int | None = None) -> bool:
    """A private Ray cluster on this machine (see the module's docstring); False when Ray is already up."""
    # Before Ray is imported: with clusters "disabled" a node takes the loopback address for its own and every
    # server of the cluster listens there (Ray otherwise binds to the machine's address, or to all of them).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray = ray_module()
    if ray.is_initialized():
        return False
    temp_dir = tempfile.mkdtemp(prefix="fr-", dir="/tmp")
    _local_dirs.append(temp_dir)
    ray.init(num_cpus=num_cpus, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
             _node_ip_address="127.0.0.1", _temp_dir=temp_dir, log_to_driver=False, configure_logging=False)
    return True


def stop_local_ray() -> None:
    """``ray.shutdown`` of the private cluster, and its temporary directory removed."""
    ray_module().shutdown()
    while _local_dirs:
        shutil.rmtree(_local_dirs.pop(), ignore_errors=True)


class TrainingActor:
    """One Ray worker: trains the jobs it is handed (``simulation.worker.train_client``)."""

    def __init__(self) -> None:
        worker_setup()

    def train(self, job: Job) -> Outcome:
        return train_client(job)


class RayBackend:
    """A pool of Ray actors, on a cluster (``address``) or on a private local one."""

    def __init__(self, workers: int = 0, address: str = "") -> None:
        ray = ray_module()
        self.ray = ray
        self.owned = False
        if address:
            if not ray.is_initialized():
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            self.owned = start_local_ray()
        self.workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.actor_class = ray.remote(num_cpus=1)(TrainingActor)
        self.idle = [self.actor_class.remote() for _ in range(self.workers)]
        self.queue: collections.deque[Job] = collections.deque()
        self.running: dict[Any, tuple[Any, Job]] = {}

    def submit(self, job: Job) -> None:
        self.queue.append(job)
        self.dispatch()

    def dispatch(self) -> None:
        while self.queue and self.idle:
            actor = self.idle.pop()
            job = self.queue.popleft()
            self.running[actor.train.remote(job)] = (actor, job)

    def results(self, timeout_s: float) -> list[Outcome]:
        self.dispatch()
        if not self.running:
            time.sleep(timeout_s)
            return []
        ready, rest = self.ray.wait(list(self.running), num_returns=1, timeout=timeout_s)
        if not ready:
            return []
        if rest:
            ready += self.ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        outcomes = []
        for ref in ready:
            actor, job = self.running.pop(ref)
            try:
                outcomes.append(self.ray.get(ref))
                self.idle.append(actor)
            except Exception as exc:  # the actor died (RayActorError) or the job failed to travel
                log.error("a Ray worker failed client %s's job: %s", job.client.client_id, exc)
                outcomes.append(failed(job, f"its Ray worker failed: {type(exc).__name__}"))
                self.idle.append(self.actor_class.remote())
        self.dispatch()
        return outcomes

    def close(self) -> None:
        for actor in self.idle + [actor for actor, _ in self.running.values()]:
            self.ray.kill(actor)
        self.idle, self.running = [], {}
        if self.owned:
            stop_local_ray()
