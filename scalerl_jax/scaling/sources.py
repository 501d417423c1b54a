"""Eval curves from other trainers' logs, each as a :class:`~scalerl_jax.scaling.io.RunCurve` for ``fit_runs``.

Three sources beside a run's metrics.jsonl:

- a CSV table with a header row (``load_csv``);
- TensorBoard event files (``load_tensorboard``; needs the ``tensorboard`` package's event reader);
- a Weights & Biases run history (``load_wandb_history``): exported as CSV, as JSON (``run.history()``'s
  ``to_json(orient="records")``), as JSON lines (``wandb-history.jsonl``), or the run directory that ``wandb`` writes
  in offline mode (its ``run-<id>.wandb`` log, read with ``read_wandb_run``).

The columns (tags) holding compute and reward are named by the caller; ``compute_per_step`` turns a step column into
compute (compute = step x cost per step). Rows with a blank or non-finite compute or reward are skipped with a
warning, as ``load_run`` does; a missing column or a cell that is not a number is a ValueError naming the file, the
line (or record) and the column.
"""

from __future__ import annotations

import csv
import json
import math
import re
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np

from .checks import ScalingFitWarning
from .io import RunCurve

__all__ = ["load_csv", "load_tensorboard", "load_wandb_history", "read_wandb_run", "curve_from_points"]

_BLANK = {"", "nan", "NaN", "NAN", "null", "None", "none"}


def curve_from_points(points: list[dict], *, name: str, path: str, compute_key: str, reward_key: str) -> RunCurve:
    """A RunCurve from points ``{"compute", "reward", "step", "n", "k"}`` (``n``/``k`` may be None).

    Points without a finite compute or reward are skipped with a warning; points repeating a compute value keep the
    last one (a resumed run re-logging a step), as ``load_run`` does. Messages name the source by ``path``.
    """
    label = path
    good = [p for p in points if _finite(p["compute"]) and _finite(p["reward"])]
    if len(good) < len(points):
        warnings.warn(f"{label}: skipped {len(points) - len(good)} rows without a finite {compute_key!r} or "
                      f"{reward_key!r}", ScalingFitWarning, stacklevel=3)
    if not good:
        raise ValueError(f"{label}: no rows with a finite {compute_key!r} and {reward_key!r}")
    good.sort(key=lambda p: p["compute"])
    dedup = {}
    for p in good:
        dedup[p["compute"]] = p
    if len(dedup) < len(good):
        warnings.warn(f"{label}: {len(good) - len(dedup)} rows repeat a {compute_key} value; kept the last of each",
                      ScalingFitWarning, stacklevel=3)
    pts = list(dedup.values())
    counts = all(_finite(p.get("n")) and _finite(p.get("k")) for p in pts)
    if not counts and any(p.get("n") is not None or p.get("k") is not None for p in pts):
        warnings.warn(f"{label}: prompt/sample counts missing on some rows; fitting without them (Gaussian "
                      "likelihood)", ScalingFitWarning, stacklevel=3)
    return RunCurve(
        name=name,
        path=path,
        compute_key=compute_key,
        compute=np.array([p["compute"] for p in pts], dtype=float),
        reward=np.array([p["reward"] for p in pts], dtype=float),
        step=np.array([p["step"] if p.get("step") is not None else -1 for p in pts]),
        val_n=np.array([p["n"] for p in pts], dtype=float) if counts else None,
        val_k=np.array([p["k"] for p in pts], dtype=float) if counts else None,
        reward_key=reward_key,
    )


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _compute_key(col: str, per_step: float | None) -> str:
    return col if per_step is None else f"{col}*{per_step:g}"


def _scaled(x, per_step: float | None):
    return x * per_step if per_step is not None and _finite(x) else x


def _check_per_step(per_step: float | None) -> None:
    if per_step is not None and not (math.isfinite(per_step) and per_step > 0):
        raise ValueError(f"compute_per_step must be a positive number, got {per_step}")


# ---- CSV ----


def _cell(text: str | None, file, line: int, col: str) -> float | None:
    """A CSV cell as a float; None when blank or NaN (skipped later); ValueError when it is not a number."""
    text = (text or "").strip()
    if text in _BLANK:
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{file}:{line}: column {col!r} holds {text!r}, not a number") from None


def load_csv(file, compute_col: str, reward_col: str, *, n_col: str | None = None, k_col: str | None = None,
             compute_per_step: float | None = None, name: str | None = None) -> RunCurve:
    """One curve from a CSV table with a header row: compute from ``compute_col`` (times ``compute_per_step`` when
    given: a step column), reward from ``reward_col``, and optionally prompts / samples per prompt from ``n_col`` /
    ``k_col`` (for the binomial likelihood). The curve is named ``name`` or the file's stem."""
    _check_per_step(compute_per_step)
    path = Path(file)
    if not path.is_file():
        raise FileNotFoundError(f"no CSV file at {path}")
    cols = {"compute": compute_col, "reward": reward_col, "n": n_col, "k": k_col}
    points = []
    with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's export may start with a BOM
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        for col in [c for c in cols.values() if c is not None]:
            if col not in header:
                raise ValueError(f"{path}:1: no column {col!r} in the header (columns: {', '.join(header) or 'none'})")
        for row in reader:
            vals = {k: _cell(row.get(c), path, reader.line_num, c) for k, c in cols.items() if c is not None}
            raw = vals["compute"]
            vals["step"] = int(raw) if compute_per_step is not None and raw is not None and raw.is_integer() else None
            vals["compute"] = _scaled(raw, compute_per_step)
            points.append(vals)
    return curve_from_points(points, name=name or path.stem, path=str(path),
                             compute_key=_compute_key(compute_col, compute_per_step), reward_key=reward_col)


# ---- TensorBoard ----


def _event_dir(directory: Path) -> Path:
    """The one directory under ``directory`` (itself first) holding TensorBoard event files."""
    if not directory.is_dir():
        raise FileNotFoundError(f"no TensorBoard directory at {directory}")
    if any(directory.glob("*tfevents*")):
        return directory
    found = sorted({p.parent.resolve() for p in directory.rglob("*tfevents*") if p.is_file()})
    if len(found) == 1:
        return found[0]
    if not found:
        raise FileNotFoundError(f"{directory}: no TensorBoard event files (events.out.tfevents.*) in it or below")
    raise ValueError(f"{directory}: event files in {len(found)} directories ({', '.join(map(str, found))}); "
                     "give one of them")


def _tb_series(acc, tags: dict, tag: str, where: Path) -> dict[int, float]:
    """{step: value} of one scalar tag: a simple value (tensorboardX, PyTorch) or a one-element tensor (TF2's
    tf.summary.scalar, which flax and CLU write)."""
    from tensorboard.util import tensor_util

    if tag in tags.get("scalars", []):
        return {e.step: float(e.value) for e in acc.Scalars(tag)}
    if tag in tags.get("tensors", []):
        out = {}
        for e in acc.Tensors(tag):
            arr = tensor_util.make_ndarray(e.tensor_proto)
            if arr.size != 1 or not np.issubdtype(arr.dtype, np.number):
                raise ValueError(f"{where}: tag {tag!r} holds {arr.dtype} tensors of shape {arr.shape}, not scalars")
            out[e.step] = float(arr.reshape(()))
        return out
    have = sorted(set(tags.get("scalars", [])) | set(tags.get("tensors", [])))
    raise ValueError(f"{where}: no scalar tag {tag!r} (tags: {', '.join(have) or 'none'})")


def load_tensorboard(directory, compute_tag: str, reward_tag: str, *, n_tag: str | None = None,
                     k_tag: str | None = None, compute_per_step: float | None = None,
                     name: str | None = None) -> RunCurve:
    """One curve from the scalars of TensorBoard event files, read with ``tensorboard``'s EventAccumulator (every
    event kept): simple values as tensorboardX and PyTorch write them, or one-element tensors as TF2's
    ``tf.summary.scalar`` (flax, CLU) does. Rewards are matched to compute by step; ``compute_tag="step"`` uses the
    step itself as compute (times ``compute_per_step`` when given). A run that restarted and re-logged steps keeps
    the newer values (the reader drops the orphaned ones). The curve is named ``name`` or the directory's name (its
    parent's when the directory is a run's ``tensorboard`` folder)."""
    _check_per_step(compute_per_step)
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError:
        raise ImportError("reading TensorBoard event files needs the tensorboard package: pip install tensorboard") \
            from None
    given = Path(directory)
    where = _event_dir(given)
    acc = event_accumulator.EventAccumulator(
        str(where), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    wanted = {"reward": reward_tag, "n": n_tag, "k": k_tag}
    if compute_tag != "step":
        wanted["compute"] = compute_tag
    by_key = {key: _tb_series(acc, tags, tag, where) for key, tag in wanted.items() if tag is not None}
    points = []
    for step, reward in by_key["reward"].items():
        compute = float(step) if compute_tag == "step" else by_key["compute"].get(step)
        points.append({"compute": _scaled(compute, compute_per_step), "reward": reward, "step": step,
                       "n": by_key.get("n", {}).get(step), "k": by_key.get("k", {}).get(step)})
    default = given.resolve().parent.name if given.name == "tensorboard" else given.resolve().name
    return curve_from_points(points, name=name or default, path=str(where),
                             compute_key=_compute_key(compute_tag, compute_per_step), reward_key=reward_tag)


# ---- Weights & Biases ----

_WANDB_HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version 0
_WANDB_RECORD = struct.Struct("<IHB")  # crc32 of (type byte + data), data length, type (full/first/middle/last)
_WANDB_BLOCK = 32768


def _wandb_record_bytes(file: Path):
    """The records of a ``.wandb`` transaction log, as bytes.

    The log is LevelDB's log format under a 7-byte W&B header: 32 KiB blocks of chunks (checksum, length, type),
    a record split over chunks when it crosses a block. The wandb library writes it from its Go core and has no
    Python reader, so the framing is read here and the records are decoded with the library's own protobuf classes.
    A truncated tail (a run killed mid-write) ends the log with a warning.
    """
    data = file.read_bytes()
    if len(data) < _WANDB_HEADER.size:
        raise ValueError(f"{file}: too short for a W&B run log")
    ident, magic, version = _WANDB_HEADER.unpack_from(data)
    if ident != b":W&B" or magic != 0xBEE1 or version != 0:
        raise ValueError(f"{file}: not a W&B run log this reader knows (header {data[:7]!r})")
    pos, parts, intact = _WANDB_HEADER.size, [], True
    while pos < len(data):
        left = _WANDB_BLOCK - pos % _WANDB_BLOCK
        if left < _WANDB_RECORD.size:  # a block's tail too short for a chunk header is zero padding
            pos += left
            continue
        crc, length, kind = _WANDB_RECORD.unpack_from(data, pos) if pos + _WANDB_RECORD.size <= len(data) else \
            (None, 0, None)
        chunk = data[pos + _WANDB_RECORD.size:pos + _WANDB_RECORD.size + length]
        if crc == 0 and length == 0 and kind == 0:  # zero padding at the end of a block
            pos += left
            continue
        if crc is None or len(chunk) < length or zlib.crc32(bytes([kind]) + chunk) != crc:
            intact = False
            break
        pos += _WANDB_RECORD.size + length
        parts.append(chunk)
        if kind in (1, 4):  # a full record, or the last chunk of a split one
            yield b"".join(parts)
            parts = []
        elif kind not in (2, 3):
            raise ValueError(f"{file}: unknown chunk type {kind} at byte {pos}")
    if parts or not intact:
        warnings.warn(f"{file}: the log ends in a truncated or damaged record at byte {pos}; read the ones before",
                      ScalingFitWarning, stacklevel=3)


def _wandb_logs(path: Path) -> list[Path]:
    """The ``run-<id>.wandb`` logs of one run under ``path`` (a file, an offline run directory, or a folder holding a
    run's offline directories, one per resume), oldest first."""
    if path.is_file():
        return [path]
    logs = sorted({p.resolve() for p in path.rglob("run-*.wandb") if p.is_file()}, key=_start_order)
    ids = sorted({p.stem[len("run-"):] for p in logs})
    if len(ids) > 1:
        raise ValueError(f"{path}: logs of {len(ids)} W&B runs ({', '.join(ids)}); give one run's directory")
    return logs


_RUN_DIR = re.compile(r"(?:offline-)?run-(\d{8}_\d{6})-([a-z0-9]+)(?:-(\d+))?")  # wandb's run directory names


def _start_order(log: Path):
    """Sort key of a run log: its directory's start time, then the counter wandb appends to a repeated name."""
    m = _RUN_DIR.fullmatch(log.parent.name)
    return (m.group(1), int(m.group(3) or 0)) if m else (log.parent.name, 0)


def read_wandb_run(path) -> list[dict]:
    """The history rows of a W&B run written in offline mode (or a synced run's local log): one dict per
    ``wandb.log`` commit, keys as logged (nested keys joined with "."), with ``_step``. ``path`` is a ``.wandb``
    file, an ``offline-run-*`` / ``run-*`` directory, or a folder holding one run's directories (a resumed
    offline run writes one per start; their rows are read in order)."""
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError:
        raise ImportError("reading a W&B run directory needs the wandb package: pip install wandb") from None
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no W&B run at {path}")
    logs = _wandb_logs(path)
    if not logs:
        raise FileNotFoundError(f"{path}: no W&B run log (run-<id>.wandb) in it or below")
    rows = []
    for log in logs:
        for raw in _wandb_record_bytes(log):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(raw)
            if rec.WhichOneof("record_type") != "history":
                continue
            row = {}
            for item in rec.history.item:
                key = item.key or ".".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            row.setdefault("_step", rec.history.step.num)
            rows.append(row)
    return rows


def _history_rows(path: Path) -> tuple[list[tuple[int, dict]], str]:
    """The rows of a W&B history in JSON (a list of records), JSON lines or an offline run, each with its number in
    messages, and what that number counts ("record" or "line"). Unparseable lines of JSON lines (a run killed
    mid-write) are skipped with a warning, as ``load_run`` does."""
    if path.is_dir() or path.suffix == ".wandb":
        return list(enumerate(read_wandb_run(path), 1)), "record"
    if not path.is_file():
        raise FileNotFoundError(f"no W&B history at {path}")
    text = path.read_text()
    if text.lstrip().startswith("["):
        try:
            rows, where = list(enumerate(json.loads(text), 1)), "record"
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    else:
        rows, where, broken = [], "line", 0
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((i, json.loads(line)))
                except json.JSONDecodeError:
                    broken += 1
        if broken:
            warnings.warn(f"{path}: skipped {broken} unparseable lines", ScalingFitWarning, stacklevel=3)
    for i, r in rows:
        if not isinstance(r, dict):
            raise ValueError(f"{path}: {where} {i} is not a JSON object (one object per history row)")
    return rows, where


def _json_value(v, file, where: str, i: int, col: str) -> float | None:
    if v is None or (isinstance(v, str) and v.strip() in _BLANK):
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{file}: {where} {i}: column {col!r} holds {v!r}, not a number")
    return float(v)


def load_wandb_history(path, compute_col: str, reward_col: str, *, n_col: str | None = None,
                       k_col: str | None = None, compute_per_step: float | None = None,
                       name: str | None = None) -> RunCurve:
    """One curve from a W&B run history: a CSV export (read as ``load_csv``), a JSON list of records, JSON lines
    (``wandb-history.jsonl``), or an offline run directory / ``.wandb`` log. History rows are sparse (each
    ``wandb.log`` call logs some keys): rows without the reward column (or with null there) are not evals and are
    passed over; a column that no row has is an error. Use ``compute_col="_step"`` with ``compute_per_step`` for
    compute from W&B's step. The curve is named ``name``, or after the file (the run id for an offline run)."""
    _check_per_step(compute_per_step)
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return load_csv(path, compute_col, reward_col, n_col=n_col, k_col=k_col, compute_per_step=compute_per_step,
                        name=name)
    rows, where = _history_rows(path)
    cols = {"compute": compute_col, "reward": reward_col, "n": n_col, "k": k_col}
    seen = set().union(*(r for _, r in rows))
    for col in [c for c in cols.values() if c is not None]:
        if col not in seen:
            keys = sorted(seen)
            shown = ", ".join(keys[:30]) + (f", ... ({len(keys)} in all)" if len(keys) > 30 else "") or "none"
            raise ValueError(f"{path}: no history row has column {col!r} (columns: {shown})")
    points = []
    for i, row in rows:
        if row.get(reward_col) is None:  # not logged at this row (a JSON export writes null for it)
            continue
        p = {k: _json_value(row.get(c), path, where, i, c) for k, c in cols.items() if c is not None}
        p["compute"] = _scaled(p["compute"], compute_per_step)
        p["step"] = row.get("_step")
        points.append(p)
    return curve_from_points(points, name=name or _wandb_name(path), path=str(path),
                             compute_key=_compute_key(compute_col, compute_per_step), reward_key=reward_col)


def _wandb_name(path: Path) -> str:
    """A W&B history's default curve name: the run id for a ``.wandb`` log or an ``offline-run-*`` directory, else
    the directory's name or the file's stem."""
    if path.suffix == ".wandb":
        return path.stem[len("run-"):] if path.stem.startswith("run-") else path.stem
    m = _RUN_DIR.fullmatch(path.resolve().name)
    if m:
        return m.group(2)
    return path.resolve().name if path.is_dir() else path.stem
