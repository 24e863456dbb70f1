"""Kernel byte counters: TCP_INFO parsing and a loopback transfer, /proc/net/dev parsing, the wire estimate."""

from __future__ import annotations

import socket
import struct
import sys
import threading
from pathlib import Path

import pytest

from fedge.meter import interface_counters, tcp_counters, tcp_counters_to, wire_bytes_estimate
from fedge.meter.net import parse_tcp_info


def test_parse_tcp_info_reads_fields_at_their_offsets() -> None:
    raw = bytearray(232)
    struct.pack_into("=QQ", raw, 120, 1234, 5678)
    struct.pack_into("=QQ", raw, 200, 1300, 66)
    counters = parse_tcp_info(bytes(raw))
    assert (counters.bytes_acked, counters.bytes_received, counters.bytes_sent, counters.bytes_retrans) == (
        1234, 5678, 1300, 66)


def test_an_old_kernel_struct_leaves_missing_fields_none() -> None:
    raw = bytearray(192)  # a 4.9-era tcp_info: bytes_acked/received present, bytes_sent/retrans absent
    struct.pack_into("=QQ", raw, 120, 7, 8)
    counters = parse_tcp_info(bytes(raw))
    assert (counters.bytes_acked, counters.bytes_received, counters.bytes_sent) == (7, 8, None)
    assert parse_tcp_info(bytes(104)).bytes_acked is None


def test_tcp_counters_of_a_non_socket_is_none(tmp_path: Path) -> None:
    with open(tmp_path / "f", "w") as handle:
        assert tcp_counters(handle.fileno()) is None


@pytest.mark.skipif(sys.platform != "linux", reason="TCP_INFO byte counters are Linux-only")
@pytest.mark.timeout(20)
def test_loopback_transfer_is_counted_by_the_kernel() -> None:
    size = 1_000_000
    server = socket.create_server(("127.0.0.1", 0))
    received = bytearray()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while len(received) < size:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                received.extend(chunk)
            conn.sendall(b"ok")
            conn.recv(1)  # hold the connection open until the client closes, so its counters stay still

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = socket.create_connection(server.getsockname(), timeout=10)
    try:
        client.sendall(b"x" * size)
        assert client.recv(2) == b"ok"
        counters = tcp_counters(client.fileno())
        assert counters is not None
        assert counters.bytes_acked is not None and size <= counters.bytes_acked <= size + 1  # +1: our SYN
        assert counters.bytes_received == 2
        found = tcp_counters_to(server.getsockname())
        assert found is not None and list(found.values()) == [counters]
        client.getpeername()  # the fd stayed open and usable after being read
    finally:
        client.close()
        thread.join(5)
        server.close()
    assert tcp_counters_to(("127.0.0.1", 9)) is None


def test_interface_counters_parse_proc_net_dev(tmp_path: Path) -> None:
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/dev").write_text(
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
        "carrier compressed\n"
        "    lo:    3193      29    0    0    0     0          0         0     3193      29    0    0    0     0 "
        "      0          0\n"
        "  eth0: 123456789 1000 0 0 0 0 0 0 987654 900 0 0 0 0 0 0\n")
    counters = interface_counters(tmp_path)
    assert counters["eth0"].rx_bytes == 123456789 and counters["eth0"].tx_packets == 900
    assert counters["lo"].tx_bytes == 3193
    assert interface_counters(tmp_path / "missing") == {}


@pytest.mark.parametrize(("stream", "ip_only", "ethernet", "physical"), [
    (0, 0, 0, 0), (1448, 1500, 1514, 1538), (1449, 1553, 1581, 1629),
    (10_000_000, 10_000_000 + 6907 * 52, 10_000_000 + 6907 * 66, 10_000_000 + 6907 * 90)])
def test_wire_estimate(stream: int, ip_only: int, ethernet: int, physical: int) -> None:
    assert wire_bytes_estimate(stream, ethernet=False) == ip_only
    assert wire_bytes_estimate(stream) == ethernet
    assert wire_bytes_estimate(stream, physical=True) == physical


def test_own_connections_are_found_among_the_processs_descriptors_as_psutil_finds_them() -> None:
    """The descriptors read from /proc/self/fd name the same connections as psutil's host-wide table: each
    established one to the peer, none to another peer, none listening or closed, IPv6 included where the host has
    it."""
    from fedge.meter.net import own_tcp_fds, psutil_tcp_fds

    listeners, clients, accepted = [], [], []
    families = [(socket.AF_INET, "127.0.0.1")] + ([(socket.AF_INET6, "::1")] if socket.has_ipv6 else [])
    try:
        for family, host in families:
            try:
                listener = socket.socket(family, socket.SOCK_STREAM)
                listener.bind((host, 0))
            except OSError:
                continue  # no IPv6 loopback here
            listener.listen(8)
            listeners.append(listener)
            for _ in range(2):
                clients.append(socket.create_connection(listener.getsockname()[:2], timeout=10))
                accepted.append(listener.accept()[0])
        closed = socket.create_connection(listeners[0].getsockname()[:2], timeout=10)
        accepted.append(listeners[0].accept()[0])
        closed.close()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.connect(listeners[0].getsockname()[:2])
        clients.append(udp)
        for listener in listeners:
            remote = listener.getsockname()[:2]
            mine = own_tcp_fds(remote)
            assert mine == psutil_tcp_fds(remote)
            expected = {c.getsockname()[:2]: c.fileno() for c in clients
                        if c.type == socket.SOCK_STREAM and c.getpeername()[:2] == remote}
            assert mine == expected and len(mine) == 2
        assert own_tcp_fds(("127.0.0.1", 9)) == {}
    finally:
        for sock in (*clients, *accepted, *listeners):
            sock.close()
