"""`python -m fedge.codec`: encode / decode / inspect, and one-line errors on bad input. The commands run through
the CLI's ``main`` in this process (its exit status, stdout and stderr captured as a process would give them:
``python -m fedge.codec`` is ``raise SystemExit(main())``); one round trip and one bad input go through a real
``python -m fedge.codec`` subprocess, for the entry point and the process's exit status."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedge.codec import PROTOCOL_VERSION, retained_count, topk_mask
from fedge.codec.cli import main

ROOT = Path(__file__).resolve().parents[1]


def process(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m fedge.codec ARGS`` in a real subprocess."""
    return subprocess.run([sys.executable, "-m", "fedge.codec", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m fedge.codec ARGS`` through the CLI's ``main`` in this process: the status its ``SystemExit``
    (or return) gives, and what it wrote on stdout and stderr. An exception escaping ``main`` fails the test (a
    process would print its traceback)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors exit
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["python", "-m", "fedge.codec", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture()
def model(tmp_path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    arrays = {"conv.weight": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
              "conv.bias": rng.standard_normal(8).astype(np.float32),
              "fc.weight": rng.standard_normal((10, 72)).astype(np.float32),
              "fc.bias": rng.standard_normal(10).astype(np.float32),
              "bn.num_batches_tracked": np.array(17, dtype=np.int64)}
    np.savez(tmp_path / "in.npz", **arrays)
    return arrays


def test_dense_encode_decode_is_lossless(tmp_path: Path, model: dict[str, np.ndarray]) -> None:
    """Through real ``python -m fedge.codec`` processes."""
    assert process("encode", "--npz", str(tmp_path / "in.npz"), "-o", str(tmp_path / "t.pkt")).returncode == 0
    assert process("decode", str(tmp_path / "t.pkt"), "-o", str(tmp_path / "out.npz")).returncode == 0
    with np.load(tmp_path / "out.npz") as out:
        assert list(out.files) == list(model)
        for name, arr in model.items():
            assert out[name].dtype == arr.dtype and np.array_equal(out[name], arr)


def test_keep_makes_a_global_top_fraction_downlink(tmp_path: Path, model: dict[str, np.ndarray]) -> None:
    down = tmp_path / "down.pkt"
    assert run("encode", "--npz", str(tmp_path / "in.npz"), "--keep", "0.3", "-o", str(down)).returncode == 0
    assert run("decode", str(down), "-o", str(tmp_path / "out.npz")).returncode == 0
    weights = [model["conv.weight"], model["fc.weight"]]
    n = sum(w.size for w in weights)
    mask = topk_mask(weights, retained_count(n, keep="0.3"))
    expect = np.concatenate([w.reshape(-1) for w in weights]) * mask
    with np.load(tmp_path / "out.npz") as out:
        got = np.concatenate([out["conv.weight"].reshape(-1), out["fc.weight"].reshape(-1)])
        assert np.array_equal(got, expect) and int(np.count_nonzero(got)) == retained_count(n, keep="0.3")
        for name in ("conv.bias", "fc.bias", "bn.num_batches_tracked"):
            assert np.array_equal(out[name], model[name])
    text = run("inspect", str(down))
    assert text.returncode == 0 and "fc.weight" in text.stdout and "mask" in text.stdout
    info = json.loads(run("inspect", str(down), "--json").stdout)
    rows = {row["name"]: row for row in info["groups"]["model"]["tensors"]}
    assert info["kind"] == "task" and rows["fc.weight"]["shape"] == [10, 72] and rows["fc.weight"]["dtype"] == "f32"
    assert rows["bn.num_batches_tracked"]["dtype"] == "i64" and rows["conv.bias"]["storage"] == "dense"
    assert sum(rows[n]["carried"] for n in ("conv.weight", "fc.weight")) == retained_count(n, keep="0.3")


def test_uplink_without_indices_decodes_against_the_downlink(tmp_path: Path, model: dict[str, np.ndarray]) -> None:
    down, up = tmp_path / "down.pkt", tmp_path / "up.pkt"
    assert run("encode", "--npz", str(tmp_path / "in.npz"), "--keep", "0.1", "-o", str(down)).returncode == 0
    trained = {k: (v + 1 if v.dtype.kind == "f" else v) for k, v in model.items()}
    np.savez(tmp_path / "trained.npz", **trained)
    assert run("encode", "--npz", str(tmp_path / "trained.npz"), "--uplink-for", str(down), "-o", str(up)).returncode == 0
    info = json.loads(run("inspect", str(up), "--json").stdout)
    assert info["kind"] == "update" and info["groups"]["model"]["sparse"]["kind"] == "masked-values"
    assert run("decode", str(up), "--mask-from", str(down), "-o", str(tmp_path / "u.npz")).returncode == 0
    assert run("decode", str(down), "-o", str(tmp_path / "d.npz")).returncode == 0
    with np.load(tmp_path / "u.npz") as u, np.load(tmp_path / "d.npz") as d:
        for name in ("conv.weight", "fc.weight"):
            kept = d[name] != 0
            assert np.array_equal(u[name][~kept], trained[name][~kept]) and not u[name][kept].any()
        assert np.array_equal(u["fc.bias"], trained["fc.bias"])


def test_lossy_dtype_option(tmp_path: Path, model: dict[str, np.ndarray]) -> None:
    assert run("encode", "--npz", str(tmp_path / "in.npz"), "--dtype", "bf16", "-o", str(tmp_path / "b.pkt")).returncode == 0
    assert run("decode", str(tmp_path / "b.pkt"), "-o", str(tmp_path / "b.npz")).returncode == 0
    with np.load(tmp_path / "b.npz") as out:
        x, y = model["fc.weight"], out["fc.weight"]
        assert (np.abs(y - x) <= 2.0**-8 * np.abs(x)).all()


def bad_inputs(tmp: Path) -> list[list[str]]:
    (tmp / "garbage.pkt").write_bytes(b"FEDG" + bytes((PROTOCOL_VERSION, 3, 0, 0)) + b"\x00" * 40)
    (tmp / "text.npz").write_text("not a zip")
    np.savez(tmp / "strings.npz", names=np.array(["a", "b"]))
    np.savez(tmp / "dense.npz", w=np.ones((2, 2), np.float32))
    run("encode", "--npz", str(tmp / "dense.npz"), "-o", str(tmp / "dense.pkt"))
    run("encode", "--npz", str(tmp / "dense.npz"), "--keep", "0.5", "-o", str(tmp / "down.pkt"))
    run("encode", "--npz", str(tmp / "dense.npz"), "--uplink-for", str(tmp / "down.pkt"), "-o", str(tmp / "up.pkt"))
    (tmp / "truncated.pkt").write_bytes((tmp / "down.pkt").read_bytes()[:30])
    out = str(tmp / "x")
    return [
        ["decode", str(tmp / "missing.pkt"), "-o", out],
        ["decode", str(tmp / "garbage.pkt"), "-o", out],
        ["inspect", str(tmp / "truncated.pkt")],
        ["inspect", str(tmp / "text.npz")],
        ["encode", "--npz", str(tmp / "text.npz"), "-o", out],
        ["encode", "--npz", str(tmp / "strings.npz"), "-o", out],
        ["encode", "--npz", str(tmp / "dense.npz"), "--keep", "1.5", "-o", out],
        ["encode", "--npz", str(tmp / "dense.npz"), "--keep", "lots", "-o", out],
        ["encode", "--npz", str(tmp / "dense.npz"), "--uplink-for", str(tmp / "dense.pkt"), "-o", out],
        ["decode", str(tmp / "up.pkt"), "-o", out],
        ["decode", str(tmp / "up.pkt"), "--mask-from", str(tmp / "garbage.pkt"), "-o", out],
        ["encode", "--npz", str(tmp / "dense.npz"), "--dtype", "f64", "-o", out],
        ["encode", "-o", out],
        ["frobnicate"],
    ]


def test_bad_input_gives_one_line_and_a_failure_status(tmp_path: Path) -> None:
    inputs = bad_inputs(tmp_path)
    for args in inputs:
        result = run(*args)
        assert result.returncode != 0, args
        assert "Traceback" not in result.stderr, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "error" in lines[0], (args, result.stderr)
    for args in (inputs[1], inputs[-1]):  # a codec error and a usage error, from a real process
        result = process(*args)
        assert result.returncode == 2, (args, result.returncode, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "error" in lines[0], (args, result.stderr)
