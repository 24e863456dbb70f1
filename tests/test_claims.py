"""A claim is taken once, refused to a second taker while its heartbeat lives, broken when stale, and released."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fedge.plumbing.claims import Claim, ClaimHeld, read_claim


def test_a_claim_is_exclusive_until_released(tmp_path: Path) -> None:
    path = tmp_path / "cells" / "a.claim"
    with Claim.take(path) as claim:
        held = read_claim(path)
        assert held is not None and held["pid"] > 0 and abs(held["heartbeat"] - time.time()) < 60
        with pytest.raises(ClaimHeld, match="claimed by"):
            Claim.take(path)
        assert claim.path == path
    assert not path.exists()
    Claim.take(path).release()


def test_a_stale_claim_is_broken_and_a_live_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "a.claim"
    path.write_text(json.dumps({"host": "gone", "pid": 1, "heartbeat": time.time() - 600}))
    claim = Claim.take(path, stale_s=300)
    assert read_claim(path)["host"] != "gone"
    claim.release()
    path.write_text(json.dumps({"host": "alive", "pid": 1, "heartbeat": time.time() - 10}))
    with pytest.raises(ClaimHeld, match="alive pid 1"):
        Claim.take(path, stale_s=300)


def test_the_heartbeat_is_refreshed_while_held(tmp_path: Path) -> None:
    path = tmp_path / "a.claim"
    with Claim.take(path, heartbeat_s=0.05):
        first = read_claim(path)["heartbeat"]
        until = time.monotonic() + 10
        while time.monotonic() < until and read_claim(path)["heartbeat"] == first:
            time.sleep(0.02)
        assert read_claim(path)["heartbeat"] > first
