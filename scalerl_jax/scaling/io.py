"""Reading eval curves from a run's metrics.jsonl (schema: DESIGN.md) and cutting the fit window."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import numpy as np

from .checks import ScalingFitWarning

__all__ = ["RunCurve", "fit_window", "load_run", "task_keys"]

TASK_PREFIX = "val_reward_"  # a multi-task run's eval rows carry val_reward_<task> (and val_n_<task>)


@dataclasses.dataclass
class RunCurve:
    """One run's eval curve, sorted by compute. val_n / val_k are None unless every eval row carried them."""

    name: str
    path: str
    compute_key: str
    compute: np.ndarray
    reward: np.ndarray
    step: np.ndarray
    val_n: np.ndarray | None
    val_k: np.ndarray | None
    reward_key: str = "val_reward"  # the eval-row column the rewards came from


def _finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _metrics_file(run_dir) -> Path:
    path = Path(run_dir)
    file = path / "metrics.jsonl" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"no metrics.jsonl at {file}")
    return file


def task_keys(run_dir) -> list[str]:
    """The per-task reward keys (``val_reward_<task>``, sorted) that the eval rows of a multi-task run carry; empty
    for a single-task run."""
    keys = set()
    with open(_metrics_file(run_dir)) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and row.get("kind") == "eval":
                keys |= {k for k in row if k.startswith(TASK_PREFIX)}
    return sorted(keys)


def load_run(run_dir, compute_key: str = "device_hours", name: str | None = None,
             reward_key: str = "val_reward") -> RunCurve:
    """Eval rows ("kind": "eval") of ``run_dir``/metrics.jsonl (or of the file itself) as a RunCurve.

    ``reward_key`` is the reward column: ``val_reward`` (the whole validation set) or one task's
    ``val_reward_<task>`` (prompt counts then from ``val_n_<task>``). Rows without a finite ``compute_key`` or
    reward are skipped with a warning (an eval that failed); rows repeating a compute value (a resumed run
    re-logging a step) keep the last one. Raises FileNotFoundError / ValueError naming the file when there is
    nothing usable.
    """
    path = Path(run_dir)
    file = _metrics_file(run_dir)
    n_key = "val_n_" + reward_key[len(TASK_PREFIX):] if reward_key.startswith(TASK_PREFIX) else "val_n"
    rows, skipped, broken = [], 0, 0
    with open(file) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                broken += 1  # a run killed mid-write leaves a truncated last line
                continue
            if not isinstance(row, dict) or row.get("kind") != "eval":
                continue
            if not (_finite_number(row.get(compute_key)) and _finite_number(row.get(reward_key))):
                skipped += 1
                continue
            rows.append(row)
    if broken:
        warnings.warn(f"{file}: skipped {broken} unparseable lines", ScalingFitWarning, stacklevel=2)
    if skipped:
        warnings.warn(
            f"{file}: skipped {skipped} eval rows without a finite {compute_key!r} or {reward_key!r}",
            ScalingFitWarning,
            stacklevel=2,
        )
    if not rows:
        raise ValueError(f"{file}: no eval rows with {compute_key!r} and {reward_key!r}")
    rows.sort(key=lambda r: r[compute_key])
    dedup = {}
    for r in rows:
        dedup[r[compute_key]] = r
    if len(dedup) < len(rows):
        warnings.warn(
            f"{file}: {len(rows) - len(dedup)} eval rows repeat a {compute_key} value; kept the last of each",
            ScalingFitWarning,
            stacklevel=2,
        )
    rows = list(dedup.values())
    has_counts = all(_finite_number(r.get(n_key)) and _finite_number(r.get("val_k")) for r in rows)
    return RunCurve(
        name=name or (path.name if path.is_dir() else path.parent.name) or str(path),
        path=str(file),
        compute_key=compute_key,
        compute=np.array([r[compute_key] for r in rows], dtype=float),
        reward=np.array([r[reward_key] for r in rows], dtype=float),
        step=np.array([r.get("step", -1) for r in rows]),
        val_n=np.array([r[n_key] for r in rows], dtype=float) if has_counts else None,
        val_k=np.array([r["val_k"] for r in rows], dtype=float) if has_counts else None,
        reward_key=reward_key,
    )


def fit_window(curve: RunCurve, fit_until: float | None = 0.5, fit_until_compute: float | None = None):
    """Boolean mask of the points to fit: compute <= ``fit_until`` x the run's last compute, or, when
    ``fit_until_compute`` is given, compute <= that absolute value. Returns (mask, limit)."""
    if fit_until_compute is not None:
        limit = float(fit_until_compute)
        if not limit > 0:
            raise ValueError(f"fit_until_compute must be positive, got {fit_until_compute}")
    else:
        if fit_until is None or not 0 < fit_until <= 1:
            raise ValueError(f"fit_until is a fraction of the run's compute in (0, 1], got {fit_until}")
        limit = float(fit_until) * float(curve.compute.max())
    return curve.compute <= limit * (1 + 1e-12), limit
