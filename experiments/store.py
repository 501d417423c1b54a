"""The results store: finished runs' small files, kept in the repository so that a study outlives a machine.

A study (``python -m experiments.loo``) writes its runs into ``--out`` (checkpoints, weights, warm starts: large,
never committed) and copies each finished run's small files (:data:`STORED`) into ``<store>/<run>/``, by default
``results/<study>/<run>/`` in the repository. Committed, they let the study continue on another machine from a
clone: a planned run whose stored copy is finished with the same config (``experiments.loo.config_differences``)
is not run again, and the comparison is rebuilt from the stored files (the fit reads only ``metrics.jsonl``).

Layout of one stored run: ``config.json``, ``metrics.jsonl``, ``summary.json``, ``report.md`` and the figures
of ``fit/`` (``*.png``); ``stored.json`` says where and when it was stored from. A copy is written into a
temporary folder and renamed into place, so a killed copy never leaves a half-stored run that looks finished.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

STORED = ("config.json", "metrics.jsonl", "summary.json", "report.md")  # plus fit/*.png
STORED_FIGURES = ("fit", "*.png")
MARK = "stored.json"


def default_store(out: Path, root: Path | None = None) -> Path:
    """``results/<study>`` in the repository (``root``, default the working directory), the study named by its
    output directory's name: ``--out runs/loo_tiny`` stores into ``results/loo_tiny``."""
    return (root or Path.cwd()) / "results" / Path(out).resolve().name


def is_finished(run_dir: Path) -> bool:
    """A run is finished when it wrote its summary (the last thing a run writes) beside its config and metrics."""
    return all((Path(run_dir) / n).is_file() for n in ("config.json", "metrics.jsonl", "summary.json"))


def store_run(run_dir: Path, store: Path) -> Path:
    """Copy a finished run's small files into ``store/<run name>`` (replacing an earlier copy); returns that
    folder. Raises ValueError when ``run_dir`` is not finished."""
    run_dir, store = Path(run_dir), Path(store)
    if not is_finished(run_dir):
        raise ValueError(f"{run_dir} is not a finished run (it needs config.json, metrics.jsonl and summary.json)")
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
