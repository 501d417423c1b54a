"""What ``python -m benchmarks.gpu_check`` and its driver (``gpu_check_driver.py``) share: the sizes of a check
(``GPU``, the 10-minute run on one GPU; ``SMOKE``, every code path on a CPU), the report whose rows they write, and a
wall-clock budget. The check's sections (gpu_check.py) and the driver that runs each in a child process
(gpu_check_driver.py) both import this module and not each other's."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Every size the check uses; ``GPU`` is the 10-minute H200 run, ``SMOKE`` the CPU run of every code path."""

    train_model: str
    train_batch: int
    train_seq: int
    train_steps: int
    decode_models: tuple[str, ...]
    decode_batch: int
    decode_prompt: int
    decode_new: int
    decode_reps: int
    decode_chunk: int
    impl_layers: int
    impl_batch: int
    impl_seq: int
    impl_reps: int
    matmul_n: int
    kernel_tests_k: str | None  # pytest -k expression (None: every kernel test)
    shrink: bool  # CPU smoke: cut the presets down to tiny widths
    impl_fields: tuple[str, ...] | None = None  # the ``*_impl`` fields the impl section compares (None: every one)


GPU = Sizes("llama3_1b", 2, 4096, 5, ("llama3_1b", "llama3_8b"), 64, 128, 256, 2, 32, 2, 2, 4096, 5, 8192, None,
            False)
SMOKE = Sizes("llama3_1b", 2, 32, 2, ("llama3_1b", "llama3_8b"), 2, 5, 4, 1, 4, 1, 2, 16, 2, 128,
              "refused", True)
IMPL_CHOICE_MIN_S = 20.0  # an impl choice starts only with this many seconds left of its section's timeout


class Report:
    """The rows of the table: ``section, name, value, unit, detail, status`` (value None for text-only rows), and
    metadata. With a ``sink`` path, :meth:`write` replaces that file with ``{"meta", "rows"}`` (atomically)."""

    def __init__(self, sink: Path | None = None, write_every_row: bool = False) -> None:
        self.rows: list[dict] = []
        self.meta: dict = {}
        self.sink, self.write_every_row = sink, write_every_row

    def add(self, section: str, name: str, value, unit: str = "", detail: str = "", status: str = "ok") -> None:
        v = None if value is None else float(value)
        self.rows.append({"section": section, "name": name, "value": v, "unit": unit, "detail": detail,
                          "status": status})
        shown = "" if v is None else f"{v:.4g} {unit}"
        print(f"  [{section}] {name}: {shown} {detail}".rstrip(), flush=True)
        if self.write_every_row:
            self.write()

    def write(self) -> None:
        if self.sink is None:
            return
        self.sink.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.sink.with_name(self.sink.name + ".tmp")
        tmp.write_text(json.dumps({"meta": self.meta, "rows": self.rows}, indent=1))
        os.replace(tmp, self.sink)

    def error(self, section: str, name: str, e: BaseException) -> None:
        self.add(section, name, None, detail=f"{type(e).__name__}: {e}"[:400], status="error")

    def table(self) -> str:
        w = max([len(r["name"]) for r in self.rows] + [4])
        lines = [f"{'section':<13} {'name':<{w}} {'value':>12} {'unit':<10} status  detail", "-" * (w + 60)]
        for r in self.rows:
            v = "" if r["value"] is None else f"{r['value']:.4g}"
            lines.append(f"{r['section']:<13} {r['name']:<{w}} {v:>12} {r['unit']:<10} {r['status']:<7} "
                         f"{r['detail']}")
        return "\n".join(lines)

    def summary(self) -> str:
        """One line per section run: rows by status and the section's wall seconds (``meta["section_wall_s"]``)."""
        walls = self.meta.get("section_wall_s", {})
        lines = [f"{'section':<20} {'ok':>4} {'error':>6} {'skipped':>8} {'unavail.':>9} {'wall s':>8}"]
        for name, wall in walls.items():
            section = name.split()[0]
            rows = [r for r in self.rows if r["section"] == section
                    and (section != "decode" or name == section or name.split()[1] in r["name"])]
            n = {s: sum(r["status"] == s for r in rows) for s in ("ok", "error", "skipped", "unavailable")}
            lines.append(f"{name:<20} {n['ok']:>4} {n['error']:>6} {n['skipped']:>8} {n['unavailable']:>9} "
                         f"{wall:>8.1f}")
        return "\n".join(lines)


class Budget:
    """Seconds left of ``seconds`` from now."""

    def __init__(self, seconds: float) -> None:
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()
