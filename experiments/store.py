"""Run directories and the results store: what a run directory holds, when a run is finished, whether it is the
planned run, and the store of finished runs' small files, kept in the repository so that a study outlives a machine.

A run directory (``--out``) holds :data:`RUN_OUTPUTS` beside its ``config.json``; the run path writes
``summary.json`` (:data:`FINISHED`) last, after the fit and report.md, so a run is finished when it is there
(:func:`is_finished`: the one definition the run path, the leave-one-out runner and the store use). A run's
``config.json`` is compared with a plan by :func:`config_differences`, and :func:`run_state` says what a study does
with a run directory (reuse, resume, start, or move aside and start over).

A study (``python -m experiments.loo``) writes its runs into ``--out`` (checkpoints, weights, warm starts: large,
never committed) and copies each finished run's small files (:data:`STORED`) into ``<store>/<run>/``, by default
``results/<study>/<run>/`` in the repository. Committed, they let the study continue on another machine from a
clone: a planned run whose stored copy is finished with the same config (:func:`config_differences`)
is not run again, and the comparison is rebuilt from the stored files (the fit reads only ``metrics.jsonl``).

Layout of one stored run: ``config.json``, ``metrics.jsonl``, ``summary.json``, ``report.md`` and the figures
of ``fit/`` (``*.png``); ``stored.json`` says where and when it was stored from. A copy is written into a
temporary folder and renamed into place, so a killed copy never leaves a half-stored run that looks finished.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from scalerl_jax.experiments.numerics import NUMERICS
from scalerl_jax.experiments.presets import ExperimentPlan

from scalerl_jax.config import ConfigError

#: what a run writes into its directory beside config.json (what --overwrite deletes)
RUN_OUTPUTS = ("metrics.jsonl", "checkpoints", "tensorboard", "summary.json", "report.md", "fit", "weights",
               "forecast.log")
#: written last by the run path (after the fit and report.md): its presence marks a run finished
FINISHED = "summary.json"
STORED = ("config.json", "metrics.jsonl", "summary.json", "report.md")  # plus fit/*.png
STORED_FIGURES = ("fit", "*.png")
MARK = "stored.json"

# ---- run directories ---------------------------------------------------------------------------------------


def is_finished(run_dir: Path) -> bool:
    """A run is finished when it wrote its summary (:data:`FINISHED`, the last thing a run writes) beside its config
    and metrics."""
    return all((Path(run_dir) / n).is_file() for n in ("config.json", "metrics.jsonl", FINISHED))


def checkpoint_steps_on_disk(run_dir: Path) -> list[int]:
    """The step directories under ``run_dir/checkpoints`` (read from the file system; nothing is restored)."""
    ck = run_dir / "checkpoints"
    return sorted(int(p.name) for p in ck.iterdir() if p.is_dir() and p.name.isdigit()) if ck.is_dir() else []



def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool, log=print) -> None:
    """An earlier run's outputs are never lost by accident: a fresh start in a directory that holds metrics or
    checkpoints is refused (``--resume`` continues it, ``--overwrite`` deletes them first, naming what it deletes);
    ``--resume`` with metrics but no checkpoint to continue from is refused the same way."""
    metrics = run_dir / "metrics.jsonl"
    rows = sum(1 for line in open(metrics) if line.strip()) if metrics.is_file() else 0
    steps = checkpoint_steps_on_disk(run_dir)
    if (resume and steps) or (not rows and not steps):
        return
    present = [run_dir / n for n in RUN_OUTPUTS if (run_dir / n).exists()]
    what = ", ".join(str(p) for p in present)
    if overwrite:
        log(f"[run] --overwrite: deleting the earlier run's {what}")
        for p in present:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return
    held = f"metrics.jsonl with {rows} rows" + (f" and checkpoints of steps {steps}" if steps else "")
    if resume:
        raise ConfigError(f"--resume: {run_dir} has no checkpoint to continue from, but holds {held} of an earlier "
                          f"run; pass --overwrite to start over (deletes {what}) or --out NEW_DIR")
    raise ConfigError(f"{run_dir} already holds an earlier run ({held}); pass --resume to continue it, --overwrite "
                      f"to start over (deletes {what}), or --out NEW_DIR")



#: config fields added after runs were written, with the value every run written before them ran with: a stored
#: run whose config.json lacks one ran with this value (``train.row_buckets``: the full batch in every step, so a
#: study stored before it is continued with ``--set train.row_buckets=1``, its FLOPs counted the same way;
#: ``data.arith_b_max``: every a+b*c with b <= 99)
ADDED_FIELDS: dict[str, Any] = {"train.row_buckets": 1, "data.arith_b_max": 99}

#: the live forecast's fields that decide how a run goes (an early stop against a baseline); its other fields only
#: shape the forecast rows, so a stored run with other values of them is still the planned run
FORECAST_DECIDES = ("baseline", "stop_if_worse", "stop_min_evals", "stop_confirmations", "min_evals")


def config_differences(plan: ExperimentPlan, written: dict[str, Any]) -> list[str]:
    """Where a run's ``config.json`` (``written``) differs from what ``plan`` decides: one ``"field: ran X, planned
    Y"`` per differing field, none when the run is the planned one. Every config field is compared except the ones
    the plan does not decide: ``out_dir`` (where the run is), the model's architecture (it comes from the base
    checkpoint, compared as ``base_model`` when the plan names one; of ``model`` the numerics the preset decides are
    compared, :data:`~experiments.numerics.NUMERICS`), ``data.path`` when the preset supplies its own data, and a
    planned ``"auto"`` (measured from the data by the run), and the live forecast's analysis settings (its compute
    axis, NUTS sizes, time share: they shape the forecast rows written beside the run, never its training; a study
    fits every run again on its own ``--compute-key``); the forecast fields that can stop a run
    (:data:`FORECAST_DECIDES`) are compared. Keys only the run writes (``sandbox_active``) are ignored."""
    planned = json.loads(json.dumps(dataclasses.asdict(plan.exp), default=str))
    planned.pop("out_dir", None)
    planned["forecast"] = {k: v for k, v in planned["forecast"].items() if k in FORECAST_DECIDES}
    planned["model"] = {k: v for k, v in planned["model"].items() if k in NUMERICS}
    if not planned["data"].get("path"):
        planned["data"].pop("path", None)
    if plan.base_model:
        planned["base_model"] = str(Path(plan.base_model).resolve())
        if isinstance(written.get("base_model"), str):
            written = {**written, "base_model": str(Path(written["base_model"]).resolve())}
    diffs: list[str] = []

    def walk(p: Any, w: Any, path: str) -> None:
        if isinstance(p, dict):
            for k, v in p.items():
                walk(v, w.get(k, _MISSING) if isinstance(w, dict) else _MISSING, f"{path}.{k}" if path else k)
        else:
            if w is _MISSING and path in ADDED_FIELDS:
                w = ADDED_FIELDS[path]
            if p != w and p != "auto":
                diffs.append(f"{path}: ran {'nothing (absent)' if w is _MISSING else _short(w)}, planned "
                             f"{_short(p)}")

    walk(planned, written, "")
    return diffs


_MISSING = object()


def _short(v: Any, n: int = 160) -> str:
    text = json.dumps(v)
    return text if len(text) <= n else text[: n - 3] + "..."


def run_state(run_dir: Path, plan: ExperimentPlan) -> tuple[str, list[str]]:
    """What the study does with ``run_dir`` for ``plan``: ``("finished", [])`` reuses a finished run of the same
    config, ``("resume", [])`` continues an unfinished one from its checkpoints, ``("fresh", [])`` starts one
    (nothing there, or a run of the same config killed before its first checkpoint), ``("replace", why)`` starts
    over after moving aside a run of another config (``why``: :func:`config_differences`, or that there is no
    config.json to compare)."""
    cfg = run_dir / "config.json"
    if not cfg.is_file():
        held = [n for n in RUN_OUTPUTS if (run_dir / n).exists()]
        return ("replace", [f"it holds {', '.join(held)} but no config.json to compare"]) if held else ("fresh", [])
    try:
        written = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return "replace", [f"{cfg} is unreadable ({e})"]
    diffs = config_differences(plan, written) if isinstance(written, dict) else [f"{cfg} is not a JSON object"]
    if diffs:
        return "replace", diffs
    if is_finished(run_dir):
        return "finished", []
    return ("resume" if checkpoint_steps_on_disk(run_dir) else "fresh"), []


def move_aside(run_dir: Path, into: Path) -> Path:
    """Move ``run_dir`` to ``into/<name>.<k>`` (the first free k from 1): a replaced run is kept, never deleted."""
    into.mkdir(parents=True, exist_ok=True)
    k = 1
    while (into / f"{run_dir.name}.{k}").exists():
        k += 1
    dest = into / f"{run_dir.name}.{k}"
    run_dir.rename(dest)
    return dest


# ---- the results store -------------------------------------------------------------------------------------


def default_store(out: Path, root: Path | None = None) -> Path:
    """``results/<study>`` in the repository (``root``, default the working directory), the study named by its
    output directory's name: ``--out runs/loo_tiny`` stores into ``results/loo_tiny``."""
    return (root or Path.cwd()) / "results" / Path(out).resolve().name


def store_run(run_dir: Path, store: Path) -> Path:
    """Copy a finished run's small files into ``store/<run name>`` (replacing an earlier copy); returns that
    folder. Raises ValueError when ``run_dir`` is not finished."""
    run_dir, store = Path(run_dir), Path(store)
    if not is_finished(run_dir):
        raise ValueError(f"{run_dir} is not a finished run (it needs config.json, metrics.jsonl and {FINISHED})")
    dest = store / run_dir.name
    tmp = store / f".{run_dir.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = []
    for name in STORED:
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, tmp / name)
            files.append(name)
    folder, pattern = STORED_FIGURES
    for fig in sorted((run_dir / folder).glob(pattern)) if (run_dir / folder).is_dir() else []:
        (tmp / folder).mkdir(exist_ok=True)
        shutil.copy2(fig, tmp / folder / fig.name)
        files.append(f"{folder}/{fig.name}")
    (tmp / MARK).write_text(json.dumps({"from": str(run_dir.resolve()), "host": socket.gethostname(),
                                        "stored_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files},
                                       indent=2) + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def store_comparison(comparison: Path, dest: Path) -> None:
    """Copy a study's comparison (``comparison.md`` and its figures) to ``dest``, replacing an earlier copy."""
    comparison, dest = Path(comparison), Path(dest)
    if not (comparison / "comparison.md").is_file():
        return
    dest.mkdir(parents=True, exist_ok=True)
    for f in [comparison / "comparison.md", *sorted(comparison.glob("*.png"))]:
        shutil.copy2(f, dest / f.name)


def stored_run(store: Path, name: str) -> Path | None:
    """``store/<name>`` when it holds a finished stored run, else None (the caller compares its config)."""
    d = Path(store) / name
    return d if (d / MARK).is_file() and is_finished(d) else None


def commit_run(stored: Path, log=print) -> bool:
    """``git add`` + ``git commit`` of one stored run's folder (only those paths), so a long study's finished runs
    are saved as they complete; returns whether a commit was made. A folder outside a git work tree, or git
    failing, is reported and skipped: the files stay in the store either way."""
    stored = Path(stored).resolve()
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=stored, capture_output=True, text=True,
                             check=True).stdout.strip()
        rel = str(stored.relative_to(Path(top).resolve()))
        subprocess.run(["git", "add", "--", rel], cwd=top, capture_output=True, text=True, check=True)
        staged = subprocess.run(["git", "diff", "--cached", "--quiet", "--", rel], cwd=top)
        if staged.returncode == 0:
            return False  # the same files were committed already
        subprocess.run(["git", "commit", "-q", "-m", f"Results: {rel} (finished run)", "--", rel], cwd=top,
                       capture_output=True, text=True, check=True)
        return True
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or e
        log(f"[store] could not commit {stored}: {str(detail).strip()}; the files are in the store, commit them "
            "by hand")
        return False


def stored_differences(store: Path, name: str, plan: ExperimentPlan) -> tuple[Path | None, list[str]]:
    """The store's finished copy of run ``name`` (None when there is none) and how its config differs from
    ``plan`` (:func:`config_differences`; empty: it is the planned run)."""
    kept = stored_run(store, name)
    if kept is None:
        return None, []
    try:
        written = json.loads((kept / "config.json").read_text())
        if not isinstance(written, dict):
            return kept, [f"{kept / 'config.json'} is not a JSON object"]
        return kept, config_differences(plan, written)
    except (OSError, json.JSONDecodeError) as e:
        return kept, [f"{kept / 'config.json'} is unreadable ({e})"]
