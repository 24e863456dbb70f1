"""HeurpFedLA (docs/algorithms.md section 6.4): pFedLA with k = 1 retained layer by default; the code lives in pfedla."""

from fedge.algorithms.pfedla import Client, Server
from fedge.algorithms.pfedla import HeurConfig as Config

__all__ = ["Client", "Config", "Server"]
