"""HeurpFedLA (ALGORITHMS.md section 6.4): pFedLA with k = 1 retained layer by default; the code lives in pfedla."""

from algorithms.pfedla import Client, Server
from algorithms.pfedla import HeurConfig as Config

__all__ = ["Client", "Config", "Server"]
