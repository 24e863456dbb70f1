"""Kernel byte counters: Linux ``TCP_INFO`` per connection, interface counters, and the on-the-wire estimate.

``tcp_counters(fd)`` reads ``struct tcp_info`` of a TCP socket given its raw file descriptor (the descriptor is
duplicated, never closed or changed); ``own_tcp_fds`` finds this process's connections to a peer among its own
descriptors, so libzmq's sockets can be read without access to its internals. ``interface_counters`` parses
``<root>/proc/net/dev`` (context only: it counts every process's traffic). ``wire_bytes_estimate`` is the labelled TCP/IPv4/Ethernet estimate of
docs/meter.md section 4.3. Must not import zmq or any Fedge package.
"""

from __future__ import annotations

import math
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import psutil

from fedge.meter.sysfs import Root

TCP_INFO_LENGTH = 256
"""Bytes asked of getsockopt; the kernel returns min(this, its struct size)."""
# Offsets in Linux ``struct tcp_info`` (include/uapi/linux/tcp.h); each field exists when the returned length covers it.
_OFFSETS = {"bytes_acked": 120, "bytes_received": 128, "bytes_sent": 200, "bytes_retrans": 208}
_TCP_INFO = getattr(socket, "TCP_INFO", 11)
TCP_ESTABLISHED = bytes([1])  # struct tcp_info's first byte, tcpi_state, on an established connection


@dataclass(frozen=True)
class TcpCounters:
    """Cumulative counters of one TCP connection since it opened (kernel-exact stream bytes, no headers).

    ``bytes_acked``: sent bytes the peer acknowledged (+1 for a FIN). ``bytes_received``: bytes received in order.
    ``bytes_sent`` includes retransmissions and ``bytes_retrans`` counts them; both are None on kernels before 4.19
    (JetPack 4's 4.9 lacks them). A field the kernel does not fill is None."""

    bytes_acked: int | None
    bytes_received: int | None
    bytes_sent: int | None = None
    bytes_retrans: int | None = None


def parse_tcp_info(raw: bytes) -> TcpCounters:
    """Read the byte counters out of a raw ``struct tcp_info`` (little or big endian as the host)."""
    values: dict[str, int | None] = {}
    for name, offset in _OFFSETS.items():
        values[name] = struct.unpack_from("=Q", raw, offset)[0] if len(raw) >= offset + 8 else None
    return TcpCounters(**values)


def tcp_counters(fd: int) -> TcpCounters | None:
    """Counters of the TCP socket behind ``fd``; None where the platform offers no ``TCP_INFO`` or it fails."""
    if not hasattr(socket, "TCP_INFO"):
        return None
    try:
        sock = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, TCP_INFO_LENGTH)
    except OSError:
        return None
    finally:
        sock.close()
    counters = parse_tcp_info(raw)
    return counters if counters.bytes_acked is not None else None


def own_tcp_fds(remote: tuple[str, int]) -> dict[tuple[str, int], int]:
    """This process's established TCP connections to ``remote`` (host, port): local address -> fd.

    On Linux, from this process's own descriptors (``/proc/self/fd``: each socket asked its addresses and state), a
    fraction of a millisecond; elsewhere from psutil, which parses every connection of the host (tens of
    milliseconds with a few hundred, and a meter window reads it twice)."""
    fds = Path("/proc/self/fd")
    if not fds.is_dir() or socket.getdefaulttimeout() is not None:
        # With a default timeout set, making a socket object sets O_NONBLOCK, which a duplicate shares with the
        # descriptor it copies: another library's blocking socket would start failing. psutil's table touches none.
        return psutil_tcp_fds(remote)
    found: dict[tuple[str, int], int] = {}
    for entry in os.listdir(fds):
        try:
            if not os.readlink(fds / entry).startswith("socket:"):
                continue
            duplicate = os.dup(int(entry))
        except (OSError, ValueError):
            continue  # closed meanwhile
        try:
            sock = socket.socket(fileno=duplicate)  # the family and type are the socket's own
        except OSError:
            os.close(duplicate)  # the number was reused by something that is not a socket
            continue
        with sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                continue
            try:
                peer, local = sock.getpeername(), sock.getsockname()
                state = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)
            except OSError:
                continue  # not connected
            if state[:1] == TCP_ESTABLISHED and (peer[0], peer[1]) == remote:
                found[(local[0], local[1])] = int(entry)
    return found


def psutil_tcp_fds(remote: tuple[str, int]) -> dict[tuple[str, int], int]:
    """``own_tcp_fds`` through psutil's table of the host's connections."""
    found: dict[tuple[str, int], int] = {}
    try:
        connections = psutil.Process().net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return found
    for conn in connections:
        if conn.fd < 0 or not conn.raddr or conn.status != psutil.CONN_ESTABLISHED:
            continue
        if (conn.raddr.ip, conn.raddr.port) == remote:
            found[(conn.laddr.ip, conn.laddr.port)] = conn.fd
    return found


def tcp_counters_to(remote: tuple[str, int]) -> dict[tuple[str, int], TcpCounters] | None:
    """Counters of each of this process's connections to ``remote``, keyed by local address; None when the kernel
    gives none (no TCP_INFO, or no connection found)."""
    result: dict[tuple[str, int], TcpCounters] = {}
    for local, fd in own_tcp_fds(remote).items():
        counters = tcp_counters(fd)
        if counters is not None:
            result[local] = counters
    return result or None


@dataclass(frozen=True)
class InterfaceCounters:
    rx_bytes: int
    rx_packets: int
    tx_bytes: int
    tx_packets: int


def interface_counters(root: Root | str | Path = "/") -> dict[str, InterfaceCounters]:
    """Per-interface cumulative counters from ``<root>/proc/net/dev``; {} when the file is absent."""
    path = (root if isinstance(root, Root) else Root(root)).path("/proc/net/dev")
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    result: dict[str, InterfaceCounters] = {}
    for line in lines[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 10:
            continue
        result[name.strip()] = InterfaceCounters(int(fields[0]), int(fields[1]), int(fields[8]), int(fields[9]))
    return result


def wire_bytes_estimate(stream_bytes: int, mss: int = 1448, *, ethernet: bool = True,
                        physical: bool = False) -> int:
    """Estimated bytes on the link for ``stream_bytes`` of TCP payload over IPv4 (an *estimated* figure).

    Each segment of up to ``mss`` bytes (1448 with Linux's default TCP timestamps at MTU 1500) carries 20 B IPv4 +
    32 B TCP headers; ``ethernet`` adds a 14 B header per frame (what /proc/net/dev usually counts); ``physical``
    adds 4 B FCS + 20 B preamble/SFD/inter-frame gap. ACKs in the other direction, Wi-Fi MAC/PHY overhead,
    retransmissions and offload details are not included."""
    if stream_bytes < 0 or mss <= 0:
        raise ValueError("stream_bytes must be >= 0 and mss > 0")
    segments = math.ceil(stream_bytes / mss)
    per_segment = 52 + (14 if ethernet else 0) + (24 if physical else 0)
    return stream_bytes + segments * per_segment
