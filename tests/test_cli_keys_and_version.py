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
    import time

    from fedge.coordinator.transport import AllowList

    allowed, first, second = two_agent_keys(tmp_path)
    (allowed / "a.key").write_bytes(first.read_bytes())
    allow = AllowList(allowed)
    key_a = zmq.auth.load_certificate(first)[0]
    key_b = zmq.auth.load_certificate(second)[0]
    assert all(allow.callback("*", key_a) for _ in range(1000)) and allow.reads == 1
    assert not allow.callback("*", key_b)
    (allowed / "b.key").write_bytes(second.read_bytes())
    os.utime(allowed, ns=(time.time_ns(), time.time_ns() + 1_000_000))  # a coarse clock must still see it
    assert allow.callback("*", key_b) and allow.reads == 2
    (allowed / "a.key").unlink()
    assert not allow.callback("*", key_a) and allow.reads == 3


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
