"""Fedge's federated-learning algorithms: one module per algorithm (Config, Server, Client) and THE training loop.

``REGISTRY`` maps an algorithm's name to its module. Algorithms never import a transport; they exchange
``base.Payload``s that the runtime encodes.
"""

from fedge.algorithms.registry import REGISTRY, AlgorithmSpec, make_client, make_config, make_server

__all__ = ["REGISTRY", "AlgorithmSpec", "make_client", "make_config", "make_server"]
