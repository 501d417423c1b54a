"""Run metrics: metrics.jsonl (the file the scaling fit reads), TensorBoard events, console progress.

Every row is one JSON object with a ``kind`` ("train", "eval", "error", "warmstart", ...) and the
cumulative compute counters. ``offset()`` is the file's byte length; a checkpoint stores it, and a
resumed run truncates the file back to it so that no row is duplicated or lost across a resume.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _clean(v: Any) -> Any:
    if isinstance(v, (np.generic,)):
        v = v.item()
    if hasattr(v, "shape") and getattr(v, "shape", None) == ():
        v = float(np.asarray(v))
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class MetricsWriter:
    def __init__(self, run_dir: str | Path, *, resume_offset: int | None = None, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_offset is not None and self.path.exists():
            with open(self.path, "r+b") as f:
                f.truncate(resume_offset)
        elif resume_offset is None and self.path.exists():
            self.path.unlink()
        self._f = open(self.path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except Exception as e:  # noqa: BLE001 -- TensorBoard is optional output, never a reason to stop
                print(f"[metrics] TensorBoard disabled: {e}", file=sys.stderr)

    def write(self, row: dict[str, Any]) -> None:
        row = _clean(row)
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        if self._tb is not None and "step" in row:
            kind = row.get("kind", "train")
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self._tb.add_scalar(f"{kind}/{k}", v, row["step"])

    def offset(self) -> int:
        self._f.flush()
        os.fsync(self._f.fileno())
        return self.path.stat().st_size

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    rows = []
    with open(Path(run_dir) / "metrics.jsonl") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if kind is None or r.get("kind") == kind:
                    rows.append(r)
    return rows


class Progress:
    """A one-line console progress bar: step, reward, throughput and ETA (plain text when not a TTY)."""

    def __init__(self, total: int, desc: str = "rl", every_s: float = 2.0, stream=sys.stdout) -> None:
        self.total, self.desc, self.every_s, self.stream = total, desc, every_s, stream
        self.t0 = time.time()
        self._last = 0.0
        self._tty = stream.isatty()

    def update(self, step: int, force: bool = False, **fields: Any) -> None:
        now = time.time()
        if not force and now - self._last < self.every_s and step < self.total:
            return
        self._last = now
        done = max(step, 1e-9)
        eta = (now - self.t0) / done * max(self.total - step, 0)
        width = 24
        filled = int(width * min(step / max(self.total, 1), 1.0))
        bar = "#" * filled + "." * (width - filled)
        extra = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        line = f"[{self.desc}] [{bar}] {step}/{self.total} {extra} eta {eta:5.0f}s"
        self.stream.write(("\r" + line) if self._tty else (line + "\n"))
        self.stream.flush()

    def close(self) -> None:
        if self._tty:
            self.stream.write("\n")
