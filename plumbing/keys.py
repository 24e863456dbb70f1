"""CurveZMQ key files: writing a key pair in pyzmq's certificate layout, the secret one readable by its owner only
from the moment it exists. The names of the two sides' pairs. Imports nothing of Fedge; zmq only for its key
generator.
"""

from __future__ import annotations

import os
from pathlib import Path

import zmq

AGENT_KEY = "agent"
COORDINATOR_KEY = "coordinator"


def _key_file(public: bytes, secret: bytes | None) -> bytes:
    """pyzmq's certificate layout (what ``zmq.auth.load_certificate`` reads)."""
    kind = "Secret" if secret is not None else "Public"
    lines = [f"#   ZeroMQ CURVE **{kind}** Certificate, written by Fedge", "", "metadata", "curve",
             f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return ("\n".join(lines) + "\n").encode()


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a fresh temporary file created with ``mode`` (so a secret is never readable by others, not
    even for a moment), fsync it, then rename it over ``path``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)  # the umask may have taken bits away, never added any
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def generate_keys(keys_dir: str | Path, name: str, force: bool = False) -> tuple[Path, Path]:
    """Write NAME.key (public, 0644) and NAME.key_secret (0600 from its creation) in keys_dir, pyzmq's certificate
    layout; returns both paths. An existing pair is refused unless ``force``: a new pair locks out every peer that
    holds the old public key."""
    keys_dir = Path(keys_dir)
    public_path, secret_path = keys_dir / f"{name}.key", keys_dir / f"{name}.key_secret"
    existing = [str(p) for p in (public_path, secret_path) if p.exists()]
    if existing and not force:
        raise FileExistsError(f"{' and '.join(existing)} already exist; pass --force to replace the key pair "
                              "(peers holding the old public key will be refused)")
    keys_dir.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    _write_new(secret_path, _key_file(public, secret), 0o600)
    _write_new(public_path, _key_file(public, None), 0o644)
    return public_path, secret_path
