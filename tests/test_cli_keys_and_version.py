"""Both CLIs: ``--version`` names Fedge's version and the wire format; ``keygen`` refuses to replace a key pair
without ``--force`` and writes the secret key 0600 from its creation, whatever the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq.auth

import fedge
from fedge import codec

COMMANDS = {"edge-agent": ("fedge.edge_agent", "agent"), "coordinator": ("fedge.runtime.cli", "coordinator")}


def cli(module: str, *args: str, cwd: Path, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    code = (f"import os, runpy, sys; os.umask({umask}); " if umask is not None else "import runpy, sys; ") + (
        f"sys.argv = ['x', *{list(args)!r}]; runpy.run_module({module!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("program", sorted(COMMANDS))
def test_version_names_fedge_and_the_wire_format(program: str, tmp_path: Path) -> None:
    out = cli(COMMANDS[program][0], "--version", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{program} {fedge.__version__} (wire format {codec.PROTOCOL_VERSION})"


@pytest.mark.parametrize("program", sorted(COMMANDS))
def test_keygen_refuses_to_overwrite_and_keeps_secrets_private(program: str, tmp_path: Path) -> None:
    module, name = COMMANDS[program]
    keys = tmp_path / "keys"
    first = cli(module, "keygen", "--keys-dir", str(keys), cwd=tmp_path, umask=0)
    assert first.returncode == 0, first.stderr
    public, secret = keys / f"{name}.key", keys / f"{name}.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(public.stat().st_mode) == 0o644
    public_key, secret_key = zmq.auth.load_certificate(secret)
    assert zmq.auth.load_certificate(public) == (public_key, None) and secret_key is not None
    assert zmq.curve_public(secret_key) == public_key
    before = (public.read_bytes(), secret.read_bytes())

    again = cli(module, "keygen", "--keys-dir", str(keys), cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    assert (public.read_bytes(), secret.read_bytes()) == before
    secret.unlink()  # half a pair is refused too: the public half may already sit in an allow-list
    assert cli(module, "keygen", "--keys-dir", str(keys), cwd=tmp_path).returncode == 2

    forced = cli(module, "keygen", "--keys-dir", str(keys), "--force", cwd=tmp_path, umask=0)
    assert forced.returncode == 0, forced.stderr
    assert public.read_bytes() != before[0] and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert not [p for p in os.listdir(keys) if p.endswith(".tmp")]


def two_agent_keys(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An empty allow-list directory and two agents' public key files."""
    from fedge.plumbing.keys import generate_keys

    allowed = tmp_path / "allowed"
    allowed.mkdir()
    return allowed, generate_keys(tmp_path / "a", "agent")[0], generate_keys(tmp_path / "b", "agent")[0]


def test_the_allow_list_is_read_once_until_its_directory_changes(tmp_path: Path) -> None:
    from fedge.coordinator.transport import AllowList

    allowed, first, second = two_agent_keys(tmp_path)
    (allowed / "a.key").write_bytes(first.read_bytes())
    clock = [allowed.stat().st_mtime_ns + 3_000_000_000]  # the directory last changed 3 s before the first read
    allow = AllowList(allowed, now_ns=lambda: clock[0])
    key_a = zmq.auth.load_certificate(first)[0]
    key_b = zmq.auth.load_certificate(second)[0]
    assert all(allow.callback("*", key_a) for _ in range(1000)) and allow.reads == 1
    assert not allow.callback("*", key_b)
    (allowed / "b.key").write_bytes(second.read_bytes())
    os.utime(allowed, ns=(clock[0], clock[0] + 1_000_000))  # a coarse clock must still see it
    assert allow.callback("*", key_b) and allow.reads == 2
    (allowed / "a.key").unlink()
    assert not allow.callback("*", key_a) and allow.reads == 3


def test_a_key_written_after_its_file_was_made_or_in_the_clock_tick_of_the_last_read_is_seen(tmp_path: Path) -> None:
    """The directory's time does not move when a key file's content is written after the file was created (`cp`
    does both), nor when a change falls in the same tick of the file system's clock as the last read: the key is
    still allowed within a recheck (the list is read again at most every RECHECK_S until it has settled)."""
    from fedge.coordinator.transport import AllowList
    from fedge.plumbing.keys import generate_keys

    allowed, first, second = two_agent_keys(tmp_path)
    third = generate_keys(tmp_path / "c", "agent")[0]
    key_a, key_b, key_c = (zmq.auth.load_certificate(path)[0] for path in (first, second, third))
    (allowed / "a.key").write_bytes(first.read_bytes())
    tick = allowed.stat().st_mtime_ns
    clock = [tick]  # the first read falls in the tick the directory last changed
    allow = AllowList(allowed, now_ns=lambda: clock[0])
    assert allow.callback("*", key_a) and not allow.callback("*", key_b)
    (allowed / "b.key").write_bytes(second.read_bytes())
    os.utime(allowed, ns=(tick, tick))  # in the same tick: the directory's stamp stays as it was read
    clock[0] += int(AllowList.RECHECK_S * 1e9)
    assert allow.callback("*", key_b)
    reads = allow.reads
    clock[0] += int(AllowList.SETTLE_S * 1e9)  # settled: trusted until the directory changes
    assert allow.callback("*", key_b) and allow.reads == reads + 1
    clock[0] += 10 * int(AllowList.RECHECK_S * 1e9)
    assert allow.callback("*", key_b) and allow.reads == reads + 1

    (allowed / "c.key").touch()  # created empty; its content comes later, with no change to the directory
    settled = allowed.stat().st_mtime_ns
    clock[0] = settled + 10 * int(AllowList.SETTLE_S * 1e9)
    assert not allow.callback("*", key_c)
    (allowed / "c.key").write_bytes(third.read_bytes())
    os.utime(allowed, ns=(settled, settled))
    clock[0] += int(AllowList.RECHECK_S * 1e9)
    assert allow.callback("*", key_c) and allow.client_id(key_c) == "c"


def test_a_key_is_allowed_as_the_client_its_file_names_and_one_key_in_two_files_as_none(tmp_path: Path) -> None:
    from fedge.coordinator.transport import AllowList

    allowed, first, second = two_agent_keys(tmp_path)
    (allowed / "pi-07.key").write_bytes(first.read_bytes())
    (allowed / "pi-08.key").write_bytes(second.read_bytes())
    (allowed / "pi-09.key").write_bytes(second.read_bytes())  # pi-08's key copied again under another id
    allow = AllowList(allowed)
    key_a = zmq.auth.load_certificate(first)[0]
    key_b = zmq.auth.load_certificate(second)[0]
    assert allow.client_id(key_a) == "pi-07" and allow.callback("*", key_a)
    assert allow.client_id(key_b) is None and not allow.callback("*", key_b)
