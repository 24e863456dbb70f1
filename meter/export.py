"""``coordinator export``: one run directory's records written to TensorBoard event files or to an MLflow
tracking store.

Every numeric field of ``metrics.jsonl`` (ints and floats, NaN included; not ``round``, which is the step,
nor booleans, strings, lists, objects or nulls) becomes a series with step = round. ``config.toml`` is
flattened into ``section.key`` parameters (TensorBoard: the text summary ``config``; MLflow: params). MLflow
also gets tags from ``provenance.json`` and ``report.json``. A last line of ``metrics.jsonl`` that does not
parse (a round being written) is left out. tensorboard and mlflow (the ``tensorboard`` and ``mlflow`` extras)
are imported only inside the functions that write to them. Reads the run directory and must never write to
it; must not import torch or any other Fedge package (docs/meter.md, "Exporting a run to TensorBoard or
MLflow").
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

Number = int | float
ParamValue = str | int | float
DEFAULT_EXPERIMENT = "fedge"
TRUNCATED = " ...(truncated)"  # ends an MLflow param value cut to MLflow's length limit


@dataclass(frozen=True)
class RunRecords:
    """What an export reads from one run directory."""

    path: Path
    name: str  # the directory's name: the TensorBoard run's and the MLflow run's name
    rows: list[dict[str, Any]]
    config: dict[str, Any]
    provenance: dict[str, Any]
    summary: dict[str, Any]  # report.json, {} while the run has none
    run_id: str | None


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file in order. A last line that does not parse is a record being written
    and is left out; any other line that does not parse is an error."""
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}: line {number} is not JSON") from None
        if not isinstance(row, dict) or type(row.get("round")) is not int:
            raise ValueError(f"{path}: line {number} is not a round's record (no integer 'round')")
        rows.append(row)
    return rows


def _json_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    found = json.loads(path.read_text())
    return found if isinstance(found, dict) else {}


def read_run(run_dir: str | Path) -> RunRecords:
    path = Path(run_dir)
    for required in ("provenance.json", "metrics.jsonl"):
        if not (path / required).is_file():
            raise FileNotFoundError(f"{path} is not a run directory (no {required})")
    rows = sorted(read_rows(path / "metrics.jsonl"), key=lambda row: row["round"])
    if not rows:
        raise ValueError(f"{path / 'metrics.jsonl'} holds no completed round yet: nothing to export")
    config_path = path / "config.toml"
    config = tomllib.loads(config_path.read_text()) if config_path.is_file() else {}
    summary = _json_file(path / "report.json")
    run_id = summary.get("run_id") or _json_file(path / "status.json").get("run_id")
    return RunRecords(path, path.resolve().name, rows, config, _json_file(path / "provenance.json"), summary,
                      str(run_id) if run_id else None)


def numeric_series(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[int, Number]]]:
    """Every numeric field of the rows as (round, value) pairs, in row order: ints and floats (NaN and
    infinities kept), not booleans, strings, lists, objects or nulls, and not ``round`` itself, which is the
    step."""
    series: dict[str, list[tuple[int, Number]]] = {}
    for row in rows:
        for field, value in row.items():
            if field != "round" and isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(field, []).append((row["round"], value))
    return series


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value, default=str)


def flatten_config(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, ParamValue]:
    """Nested tables flattened to ``section.key``: strings and numbers as they are, booleans as
    ``true``/``false``, arrays (of tables too) as JSON text, dates and times as ISO text; an empty table has
    no key."""
    flat: dict[str, ParamValue] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{name}."))
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
            flat[name] = value
        else:
            flat[name] = _text(value)
    return flat


def _library(module: str, extra: str) -> ModuleType:
    """``module``, or an ImportError (``name`` = the extra) saying how to install it."""
    try:
        importlib.import_module(module.split(".")[0])
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"exporting to {extra} needs {extra}: pip install 'fedge[{extra}]'",
                          name=extra) from error


def config_markdown(config: Mapping[str, Any]) -> str:
    """The flattened configuration as a markdown table (TensorBoard's text dashboard renders it)."""
    cells = [(key, _text(value).replace("|", "\\|")) for key, value in flatten_config(config).items()]
    rows = (f"| `{key}` | {value} |" for key, value in cells)
    return "\n".join(["| parameter | value |", "|---|---|", *rows])


def export_tensorboard(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the run as one TensorBoard run, ``out_dir/RUN_NAME``: a scalar per numeric field (tag = field,
    step = round) and the configuration as the text summary ``config`` at step 0. Refuses a directory that
    already holds event files (an earlier export): TensorBoard would show both, interleaved."""
    records = read_run(run_dir)
    event_pb2 = _library("tensorboard.compat.proto.event_pb2", "tensorboard")
    summary_pb2 = _library("tensorboard.compat.proto.summary_pb2", "tensorboard")
    tensor_pb2 = _library("tensorboard.compat.proto.tensor_pb2", "tensorboard")
    types_pb2 = _library("tensorboard.compat.proto.types_pb2", "tensorboard")
    text_metadata = _library("tensorboard.plugins.text.metadata", "tensorboard")
    event_file_writer = _library("tensorboard.summary.writer.event_file_writer", "tensorboard")
    target = Path(out_dir) / records.name
    if any(target.glob("events.out.tfevents.*")):
        raise FileExistsError(f"{target} already holds TensorBoard events (an earlier export?): remove it or "
                              "choose another --tensorboard directory")
    target.mkdir(parents=True, exist_ok=True)
    by_round: dict[int, list[Any]] = {}
    for field, points in numeric_series(records.rows).items():
        for step, value in points:
            point = summary_pb2.Summary.Value(tag=field, simple_value=float(value))
            by_round.setdefault(step, []).append(point)
    config = summary_pb2.Summary.Value(
        tag="config", metadata=text_metadata.create_summary_metadata("config", "config.toml, flattened"),
        tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING,
                                      string_val=[config_markdown(records.config).encode()]))
    now = time.time()
    writer = event_file_writer.EventFileWriter(str(target))
    try:
        writer.add_event(event_pb2.Event(wall_time=now, step=0, summary=summary_pb2.Summary(value=[config])))
        for step in sorted(by_round):
            writer.add_event(event_pb2.Event(wall_time=now, step=step,
                                             summary=summary_pb2.Summary(value=by_round[step])))
    finally:
        writer.close()
    return target


def mlflow_tags(records: RunRecords) -> dict[str, str]:
    """provenance.json's fields (``fedge_version``, ``git_commit``, ...; nulls left out), the run's
    ``run_id``, ``status`` (report.json's, else ``unfinished``), ``algorithm`` and ``run_dir`` (the
    directory's name)."""
    tags = {key: _text(value) for key, value in records.provenance.items() if value is not None}
    tags["status"] = str(records.summary.get("status") or "unfinished")
    tags["algorithm"] = str(records.summary.get("algorithm") or records.rows[0].get("algorithm") or "unknown")
    tags["run_dir"] = records.name
    if records.run_id:
        tags["run_id"] = records.run_id
    return tags


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    return (items[start:start + size] for start in range(0, len(items), size))


def export_mlflow(run_dir: str | Path, uri: str, experiment: str | None = None) -> str:
    """Log the run as a new MLflow run named after the directory, in ``experiment`` (default ``fedge``,
    created if missing) at tracking ``uri``: params from the configuration (values cut to MLflow's length
    limit end in ``...(truncated)`` and are named in the tag ``truncated_params``), metrics with step = round,
    tags (``mlflow_tags``), in batches within MLflow's limits; ends it FINISHED. Every call makes a new MLflow
    run. Returns its id."""
    records = read_run(run_dir)
    entities = _library("mlflow.entities", "mlflow")
    MlflowException = _library("mlflow.exceptions", "mlflow").MlflowException  # noqa: N806 - a class
    limits = _library("mlflow.utils.validation", "mlflow")
    tracking = _library("mlflow.tracking", "mlflow")
    params, truncated = [], []
    for key, value in flatten_config(records.config).items():
        text = str(value)
        if len(text) > limits.MAX_PARAM_VAL_LENGTH:
            text = text[:limits.MAX_PARAM_VAL_LENGTH - len(TRUNCATED)] + TRUNCATED
            truncated.append(key)
        params.append(entities.Param(key, text))
    tags = mlflow_tags(records)
    if truncated:
        tags["truncated_params"] = ",".join(truncated)[:limits.MAX_TAG_VAL_LENGTH]
    stamp = int(time.time() * 1000)
    metrics = [entities.Metric(field, float(value), stamp, step)
               for field, points in numeric_series(records.rows).items() for step, value in points]
    name, run_id = experiment or DEFAULT_EXPERIMENT, None
    try:
        client = tracking.MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(name)
        if found is not None and found.lifecycle_stage != "active":
            raise ValueError(f"the MLflow experiment {name!r} at {uri} is deleted: restore it or choose "
                             "another --experiment")
        experiment_id = found.experiment_id if found is not None else client.create_experiment(name)
        run_id = client.create_run(experiment_id, run_name=records.name).info.run_id
        for batch in _chunks(params, limits.MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(run_id, params=batch)
        for batch in _chunks([entities.RunTag(key, value) for key, value in tags.items()],
                             limits.MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(run_id, tags=batch)
        for batch in _chunks(metrics, limits.MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=batch)
        client.set_terminated(run_id, "FINISHED")
    except MlflowException as error:
        if run_id is not None:
            with contextlib.suppress(MlflowException):
                client.set_terminated(run_id, "FAILED")
        raise ValueError(f"MLflow at {uri}: {_mlflow_refusal(str(error.message))}") from error
    return str(run_id)


def _mlflow_refusal(message: str) -> str:
    """MLflow's refusal in one line, with the way out for the two a user meets first."""
    if "MLFLOW_ALLOW_FILE_STORE" in message:
        return ("this mlflow keeps the file store in maintenance mode: set MLFLOW_ALLOW_FILE_STORE=true, or "
                "log to a tracking server (http://HOST:PORT) or to sqlite:///FILE (the full mlflow package)")
    if "unsupported URI" in message:
        return ("mlflow-skinny cannot write to this kind of store: use a tracking server (http://HOST:PORT), "
                "a file: store, or the full mlflow package (pip install mlflow) for sqlite:// and other "
                "databases")
    return message.strip().splitlines()[0] if message.strip() else "refused (no message)"


def command_export(args: argparse.Namespace) -> int:
    """``coordinator export``: checks the destinations' libraries and the run directory before writing either,
    then prints one line per destination written."""
    if not args.tensorboard and not args.mlflow:
        raise ValueError("export needs a destination: --tensorboard DIR, --mlflow URI or both")
    if args.experiment and not args.mlflow:
        raise ValueError("--experiment names an MLflow experiment: it needs --mlflow URI")
    if args.tensorboard:
        _library("tensorboard.summary.writer.event_file_writer", "tensorboard")
    if args.mlflow:
        _library("mlflow.tracking", "mlflow")
    read_run(args.run_dir)
    if args.tensorboard:
        print(f"wrote TensorBoard events to {export_tensorboard(args.run_dir, args.tensorboard)}")
    if args.mlflow:
        run_id = export_mlflow(args.run_dir, args.mlflow, args.experiment)
        experiment = args.experiment or DEFAULT_EXPERIMENT
        print(f"logged MLflow run {run_id} (experiment {experiment}) to {args.mlflow}")
    return 0
