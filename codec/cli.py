"""`python -m fedge.codec`: encode .npz files into packets, decode packets back, inspect packets.

    python -m fedge.codec encode --npz IN.npz [--keep 0.1] [--dtype f32|f16|bf16|int8] -o TASK.pkt
    python -m fedge.codec encode --npz IN.npz --uplink-for TASK.pkt -o UPDATE.pkt
    python -m fedge.codec decode PACKET [--mask-from TASK.pkt] -o OUT.npz
    python -m fedge.codec inspect PACKET [--json]

`--keep F` < 1 makes a downlink that keeps the global top fraction F (by magnitude) of all
tensors with two or more dimensions and sends the rest of the tensors dense. `--uplink-for`
makes the matching uplink: IN's values at the positions the downlink pruned, with no indices.
Bad input gives one line on stderr and exit status 2. This module must not import torch, zmq
or any other Fedge package.
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from fedge.codec.errors import CodecError, Limits
from fedge.codec.masks import retained_count, topk_mask
from fedge.codec.messages import Message, Task, Update
from fedge.codec.packet import decode, encode, packet_info
from fedge.codec.sparse import SparseSection
from fedge.codec.tensors import TensorGroup, wire_dtype
from fedge.codec.values import VALUE_ENCODINGS

GROUP = "model"


class UsageError(Exception):
    """Bad command-line input that is not a codec error (missing file, wrong packet kind...)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _read_npz(path: str) -> dict[str, npt.NDArray[Any]]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    for name, arr in arrays.items():
        wire_dtype(arr, name)
    return arrays


def _read_packet(path: str) -> Message:
    with open(path, "rb") as fh:
        return decode(fh.read())


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def _downlink_mask(task: Message, path: str) -> tuple[str, SparseSection]:
    if not isinstance(task, Task):
        raise UsageError(f"{path} is a {type(task).__name__}, not a downlink (Task)")
    for name, group in task.groups.items():
        if group.sparse is not None and group.sparse.mask is not None:
            return name, group.sparse
    raise UsageError(f"{path} carries no mask (it was encoded without --keep < 1)")


def cmd_encode(args: argparse.Namespace) -> None:
    arrays = _read_npz(args.npz)
    if args.uplink_for is not None:
        if args.keep is not None:
            raise UsageError("--keep and --uplink-for exclude each other (the downlink fixes the mask)")
        task = _read_packet(args.uplink_for)
        group_name, down = _downlink_mask(task, args.uplink_for)
        missing = [n for n in down.names if n not in arrays]
        if missing:
            raise UsageError(f"{args.npz} lacks tensors the downlink masks: {', '.join(missing[:5])}")
        for name, shape in zip(down.names, down.shapes, strict=True):
            if arrays[name].shape != shape:
                raise UsageError(f"tensor {name!r} has shape {arrays[name].shape} in {args.npz}, {shape} in the downlink")
        assert down.mask is not None
        section = SparseSection.masked_from_dense(down.names, [arrays[n] for n in down.names], down.mask, False)
        dense = {n: a for n, a in arrays.items() if n not in down.names}
        message: Message = Update(task.run_id, task.round, args.sender or "agent",
                                  {group_name: TensorGroup(dense, section, args.dtype)})
    else:
        keep = "1" if args.keep is None else args.keep
        names = [n for n, a in arrays.items() if a.ndim >= 2 and a.dtype.kind == "f"]
        k = retained_count(sum(arrays[n].size for n in names), keep=keep)
        if names and k < sum(arrays[n].size for n in names):
            mask = topk_mask([arrays[n] for n in names], k)
            sparse: SparseSection | None = SparseSection.from_dense(names, [arrays[n] for n in names], mask)
            dense = {n: a for n, a in arrays.items() if n not in names}
        else:
            sparse, dense = None, arrays
        message = Task(args.run_id, args.round, args.sender or "coordinator",
                       {GROUP: TensorGroup(dense, sparse, args.dtype)})
    _write(args.output, encode(message, level=args.level))


def cmd_decode(args: argparse.Namespace) -> None:
    message = _read_packet(args.packet)
    if not isinstance(message, (Task, Update)):
        raise UsageError(f"{args.packet} is a {type(message).__name__}; only Task and Update carry tensors")
    reference = None
    if args.mask_from is not None:
        reference = _downlink_mask(_read_packet(args.mask_from), args.mask_from)[1].mask
    out: dict[str, npt.NDArray[Any]] = {}
    prefix = len(message.groups) > 1
    for group_name, group in message.groups.items():
        tensors: dict[str, npt.NDArray[Any]] = dict(group.dense)
        if group.sparse is not None:
            if group.sparse.kind == "masked-values" and reference is None:
                raise UsageError(f"{args.packet} carries values without indices; pass the downlink it answers "
                                 f"with --mask-from DOWNLINK")
            tensors.update(group.sparse.to_dense(reference if group.sparse.kind == "masked-values" else None))
        for name, arr in tensors.items():
            out[f"{group_name}/{name}" if prefix else name] = arr
    with open(args.output, "wb") as fh:
        np.savez(fh, **out)  # type: ignore[arg-type]


def json_ready(value: Any) -> Any:
    """A field's value for JSON: tuples as lists, bytes (secure aggregation's keys and sealed shares) as hex."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):
        return [json_ready(item) for item in value]
    return value


def describe(message: Message, data: bytes) -> dict[str, Any]:
    """Header fields, sizes and the tensor table of a decoded packet, JSON-ready."""
    info: dict[str, Any] = packet_info(data)
    info.update(run_id=message.run_id, round=message.round, sender=message.sender)
    for attr, value in vars(message).items():
        if attr in ("run_id", "round", "sender", "groups"):
            continue
        info[attr] = json_ready(value)
    groups = getattr(message, "groups", None)
    if groups is not None:
        info["groups"] = {}
        for gname, group in groups.items():
            rows = [{"name": n, "shape": list(a.shape), "dtype": wire_dtype(a, n), "storage": "dense",
                     "elements": int(a.size), "carried": int(a.size)} for n, a in group.dense.items()]
            if group.sparse is not None:
                sec = group.sparse
                for name, shape, count in zip(sec.names, sec.shapes, sec.counts, strict=True):
                    size = int(np.prod(shape, dtype=np.int64))
                    rows.append({"name": name, "shape": list(shape), "dtype": "f32", "storage": sec.kind,
                                 "elements": size, "carried": count})
            info["groups"][gname] = {"value_dtype": group.value_dtype, "tensors": rows,
                                     "sparse": None if group.sparse is None else dict(group.sparse.describe())}
    return info


def _print_text(info: dict[str, Any]) -> None:
    print(f"{info['kind']} (format version {info['version']}): {info['packet_bytes']} bytes, "
          f"header {info['header_bytes']} bytes, body {info['body_bytes']} bytes")
    for key, value in info.items():
        if key not in ("kind", "version", "kind_code", "packet_bytes", "header_bytes", "body_bytes",
                       "body_content_bytes", "groups"):
            print(f"  {key}: {json.dumps(value)}")
    for gname, group in info.get("groups", {}).items():
        print(f"group {gname!r}: values {group['value_dtype']}"
              + (f", sparse {json.dumps(group['sparse'])}" if group["sparse"] else ""))
        print(f"  {'name':<28} {'shape':<20} {'dtype':<5} {'storage':<14} {'carried':>10} / elements")
        for row in group["tensors"]:
            shape = "x".join(str(d) for d in row["shape"]) or "scalar"
            print(f"  {row['name']:<28} {shape:<20} {row['dtype']:<5} {row['storage']:<14} "
                  f"{row['carried']:>10} / {row['elements']}")


def cmd_inspect(args: argparse.Namespace) -> None:
    with open(args.packet, "rb") as fh:
        data = fh.read()
    info = describe(decode(data, Limits(allow_nonfinite=True)), data)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_text(info)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m fedge.codec", description="Encode, decode and inspect Fedge packets.")
    sub = parser.add_subparsers(dest="command", required=True)
    enc = sub.add_parser("encode", help="encode an .npz file as a downlink (or, with --uplink-for, an uplink)")
    enc.add_argument("--npz", required=True, help="input arrays")
    enc.add_argument("--keep", help="retained fraction of the >=2-D tensors (e.g. 0.1); default 1 = dense")
    enc.add_argument("--dtype", choices=VALUE_ENCODINGS, default="f32", help="float value encoding (default f32)")
    enc.add_argument("--uplink-for", metavar="DOWNLINK", help="encode IN's values at DOWNLINK's pruned positions")
    enc.add_argument("--run-id", default="cli", help="run id (downlinks; uplinks copy the downlink's)")
    enc.add_argument("--round", type=int, default=0, help="round number (downlinks; uplinks copy it)")
    enc.add_argument("--sender", help="sender name (default: coordinator / agent)")
    enc.add_argument("--level", type=int, default=1, help="zstd level (default 1)")
    enc.add_argument("-o", "--output", required=True, help="packet file to write")
    enc.set_defaults(func=cmd_encode)
    dec = sub.add_parser("decode", help="decode a Task/Update packet to dense arrays in an .npz file")
    dec.add_argument("packet")
    dec.add_argument("--mask-from", metavar="DOWNLINK", help="the downlink whose mask an index-free uplink uses")
    dec.add_argument("-o", "--output", required=True, help=".npz file to write (pruned positions are 0)")
    dec.set_defaults(func=cmd_decode)
    ins = sub.add_parser("inspect", help="print a packet's header and tensor table")
    ins.add_argument("packet")
    ins.add_argument("--json", action="store_true", help="print JSON instead of text")
    ins.set_defaults(func=cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (CodecError, UsageError, OSError, ValueError, zipfile.BadZipFile, KeyError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        print(f"python -m fedge.codec {args.command}: error: {reason}", file=sys.stderr)
        return 2
    return 0
