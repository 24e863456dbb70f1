"""A logical client: one simulated device, as the simulated fleet and the in-process driver both hold it.

``LogicalClient`` is what an edge agent keeps beside its training: the agent's own protocol object
(``protocol.agent.AgentProtocol``, whose ``hello`` is the one Hello a device sends), its device-state directory
(``client.state``, two phases), and the packets of its session's Welcome. Training a task is not here: that is
THE client-round function, ``client.round.play_task``. No sockets, no threads, no algorithm by name.
"""

from __future__ import annotations

import torch

import fedge
from fedge import codec
from fedge.client.state import DeviceState
from fedge.protocol.agent import AgentProtocol, DeviceFacts


def simulated_facts(dataset_size: int, input_shape: tuple[int, ...] = (), num_outputs: int = 0) -> DeviceFacts:
    """What a simulated device's Hello says: this process's Fedge and torch, a CPU."""
    return DeviceFacts(fedge_version=fedge.__version__, torch_version=torch.__version__, dataset_size=dataset_size,
                       device="cpu", input_shape=tuple(input_shape), num_outputs=num_outputs)


class LogicalClient:
    """One simulated device: its protocol object, its device state and its session's Welcome (see the module)."""

    def __init__(self, client_id: str, state_dir: str, facts: DeviceFacts, stay: bool = False) -> None:
        self.client_id = client_id
        self.peer = client_id.encode()
        self.state_dir = state_dir
        self.protocol = AgentProtocol(client_id, hello_interval_s=1.0, facts=facts, stay=stay)
        self.protocol.masked_before = self.state().masked_rounds()  # the restart rule of secure aggregation
        self.welcome: codec.Welcome | None = None
        self.welcome_frame = b""  # the Welcome packet as it arrived (a worker decodes it again)

    def hello_frame(self) -> bytes:
        return codec.encode(self.protocol.hello())

    def joined(self, welcome: codec.Welcome, frame: bytes) -> None:
        """The session the Welcome describes was joined (as an agent's driver reports it to its protocol)."""
        self.welcome, self.welcome_frame = welcome, frame
        self.protocol.joined(welcome.run_id, welcome.client_index, welcome.heartbeat_s, welcome.liveness_s,
                             welcome.seed)

    def state(self) -> DeviceState:
        return DeviceState(self.state_dir)

    def confirm(self, round_number: int) -> bool:
        """A Commit: promote this device's pending state of ``round_number``; False when it had none."""
        return self.state().confirm(self.protocol.run_id, round_number)
