"""Which host names are this machine's loopback: the one rule the coordinator's CurveZMQ default and the dashboard's
token both rest on. Standard library only; imports nothing of Fedge.
"""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """An address of this machine only: 127.0.0.0/8, ::1 (with or without brackets) or localhost. A name that merely
    starts with 127. is not."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
