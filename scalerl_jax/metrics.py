"""Run metrics: metrics.jsonl (the file the scaling fit reads), TensorBoard events, Weights & Biases (optional),
console progress.

Every row is one JSON object with a ``kind`` ("train", "eval", "error", "warmstart", ...) and the
cumulative compute counters. ``offset()`` is the file's byte length; a checkpoint stores it, and a
resumed run truncates the file back to it so that no row is duplicated or lost across a resume.
TensorBoard and W&B get every numeric field of a row that has a ``step``, as the scalar ``<kind>/<field>``.
"""

from __future__ import annotations

import json
import math
import netrc
import os
import secrets
import string
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


_ID_CHARS = string.ascii_lowercase + string.digits  # a W&B run id's alphabet


def _scalars(row: dict[str, Any]) -> dict[str, float]:
    """The row's numeric fields (but its step) as ``<kind>/<field>`` scalars, as TensorBoard and W&B get them."""
    kind = row.get("kind", "train")
    return {f"{kind}/{k}": v for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


def wandb_credentials() -> bool:
    """Whether W&B can log in without asking: WANDB_API_KEY is set, or the netrc file (NETRC or ~/.netrc) has an
    entry for the W&B host (WANDB_BASE_URL's, default api.wandb.ai)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0].split(":")[0]
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return path.is_file() and netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbSink:
    """A W&B run beside the run directory: rows go to ``run.log`` with their step, under the same scalar names as
    in TensorBoard.

    The W&B run's id is kept in RUN_DIR/wandb.json with the last step logged, so that a resumed run continues the same
    W&B run (``resume="allow"``) and skips the rows it logged before (a resume re-trains from the last checkpoint: W&B
    keeps the first values of those steps, metrics.jsonl the re-run's). A fresh run in the same directory starts a
    new W&B run. Without credentials (no WANDB_API_KEY, no netrc entry for the W&B host) and with no WANDB_MODE set,
    the run is logged offline under RUN_DIR/wandb, to upload later with ``wandb sync``.
    """

    def __init__(self, run_dir: Path, project: str, *, config: dict | None, name: str | None, resume: bool,
                 log=print) -> None:
        try:
            import wandb
        except ImportError as e:
            raise RuntimeError(f"W&B logging was asked for (project {project!r}) but the wandb package is missing "
                               f"({e}); install it with: pip install wandb") from None
        self.state_file = run_dir / "wandb.json"
        state = {}
        if resume and self.state_file.exists():
            try:
                state = json.loads(self.state_file.read_text())
            except (OSError, json.JSONDecodeError):
                state = {}
        self.run_id = state.get("id") or "".join(secrets.choice(_ID_CHARS) for _ in range(8))
        self.floor = state.get("last_step")  # rows at or below this step were logged before the resume
        self.last_step = self.floor
        offline = not os.environ.get("WANDB_MODE") and not wandb_credentials()
        try:
            self.run = wandb.init(project=project, config=_clean(config or {}), name=name, id=self.run_id,
                                  resume="allow", dir=str(run_dir), mode="offline" if offline else None,
                                  reinit="create_new")
        except Exception as e:  # noqa: BLE001 -- any init failure is the user's to see, with the project named
            raise RuntimeError(f"W&B logging was asked for (project {project!r}) but wandb.init failed: {e}") from e
        self._save()
        if offline:
            where = Path(self.run.dir).parent
            log(f"[metrics] W&B: no credentials (WANDB_API_KEY or a netrc entry); logging offline to {where}; "
                f"upload it with: wandb sync {where}")

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"id": self.run_id, "project": self.run.project, "last_step": self.last_step}))
        tmp.replace(self.state_file)

    def write(self, row: dict[str, Any]) -> None:
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        if (self.floor is not None and step <= self.floor) or (self.last_step is not None and step < self.last_step):
            return  # logged before a resume, or behind W&B's step (W&B refuses steps that go back)
        scalars = _scalars(row)
        if scalars:
            self.run.log(scalars, step=step)
        if step != self.last_step:
            self.last_step = step
            self._save()

    def close(self) -> None:
        """Finish the W&B run. ``finish`` returns before W&B's service has written all of the run's log to disk;
        when no other W&B run is active in the process, the service is shut down too, so that the run is complete
        on disk (for ``wandb sync``, or a reader) when this returns, even if the process then ends abruptly."""
        import wandb

        self.run.finish()
        if wandb.run is None:
            wandb.teardown()


class MetricsWriter:
    """metrics.jsonl, and TensorBoard (``tensorboard=True``, under RUN_DIR/tensorboard) and W&B (``wandb_project``)
    beside it.

    Args:
        run_dir: the run directory.
        resume_offset: metrics.jsonl's length stored with the checkpoint being resumed (None: a fresh run, the file
            is started over).
        tensorboard: also write TensorBoard events; a failure to start it is printed, never raised.
        wandb_project: also log every row to this W&B project (None: W&B is never imported). Offline under
            RUN_DIR/wandb when no credentials are found; a missing wandb package or a failed ``wandb.init`` is a
            RuntimeError, since the user asked for it. See :class:`WandbSink` for resumed runs.
        wandb_config: the W&B run's config (e.g. the experiment's resolved config as a dict).
        run_name: the W&B run's display name (None: W&B picks one).
    """

    def __init__(self, run_dir: str | Path, *, resume_offset: int | None = None, tensorboard: bool = True,
                 wandb_project: str | None = None, wandb_config: dict | None = None,
                 run_name: str | None = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._wandb = None
        if wandb_project:  # first: a W&B failure stops the run before metrics.jsonl is touched
            self._wandb = WandbSink(Path(run_dir), wandb_project, config=wandb_config, name=run_name,
                                    resume=resume_offset is not None, log=lambda m: print(m, file=sys.stderr))
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
            for k, v in _scalars(row).items():
                self._tb.add_scalar(k, v, row["step"])
        if self._wandb is not None:
            self._wandb.write(row)

    def offset(self) -> int:
        self._f.flush()
        os.fsync(self._f.fileno())
        return self.path.stat().st_size

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.close()


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

    def __init__(self, total: int, desc: str = "rl", every_s: float = 2.0, stream=None, start: int = 0) -> None:
        """``stream``: sys.stdout as it is when the bar is made (default); ``start``: the step the run starts from (a
        resumed run's), from which the ETA's rate is counted."""
        self.total, self.desc, self.every_s = total, desc, every_s
        self.stream = sys.stdout if stream is None else stream
        self.start = start
        self.t0 = time.time()
        self._last = 0.0
        self._tty = self.stream.isatty()

    def update(self, step: int, force: bool = False, **fields: Any) -> None:
        now = time.time()
        if not force and now - self._last < self.every_s and step < self.total:
            return
        self._last = now
        done = step - self.start  # steps taken since t0 (no step yet: no rate, no ETA)
        eta = f"{(now - self.t0) / done * max(self.total - step, 0):5.0f}s" if done > 0 else "    ?"
        width = 24
        filled = int(width * min(step / max(self.total, 1), 1.0))
        bar = "#" * filled + "." * (width - filled)
        extra = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        line = f"[{self.desc}] [{bar}] {step}/{self.total} {extra} eta {eta}"
        self.stream.write(("\r" + line) if self._tty else (line + "\n"))
        self.stream.flush()

    def close(self) -> None:
        if self._tty:
            self.stream.write("\n")
