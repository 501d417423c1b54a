"""No-Positive-Resampling (NPR) curriculum: drop prompts the policy already solves (RECIPE.md section 2).

Each prompt keeps its historical pass rate over all epochs,

    pass_rate(p) = sum of n_correct / sum of n_total over every ``update(p, ...)`` so far,

and once ``pass_rate(p) >= threshold`` (0.9 by default) the prompt is removed for good: later updates never
bring it back.

Epoch semantics (what the data pipeline must do): the pipeline calls :meth:`NPRCurriculum.filter` once, when
it builds the schedule of an epoch, and only there. A prompt removed during epoch ``e`` therefore still
finishes epoch ``e`` if it was already scheduled (its remaining samples are generated and trained on as
usual, and their results still update its counts), but it is absent from the schedule of epoch ``e + 1`` and
every later epoch. :meth:`is_active` is the per-prompt form of the same test, for schedule building;
the pipeline must not use it to skip already-scheduled prompts mid-epoch.

The state is plain data: :meth:`state_dict` returns a JSON-serialisable dict and :meth:`from_state_dict` /
:meth:`load_state_dict` restore it exactly (counts are integers, so nothing is lost to rounding). With
``enabled=False`` the history is still tracked but nothing is ever removed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_VERSION = 1


class NPRCurriculum:
    """Per-prompt pass-rate history and the set of prompts removed by No-Positive-Resampling."""

    def __init__(self, threshold: float = 0.9, enabled: bool = True) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.threshold = float(threshold)
        self.enabled = bool(enabled)
        self._counts: dict[int, list[int]] = {}  # prompt id -> [n_correct, n_total]
        self._removed: set[int] = set()

    # -- updates and queries ------------------------------------------------------------------------------
    def update(self, prompt_id: int, n_correct: int, n_total: int) -> bool:
        """Add ``n_correct`` of ``n_total`` graded samples of ``prompt_id`` to its history.

        Returns True when this update removed the prompt (its pass rate first reached the threshold).
        """
        pid, c, t = int(prompt_id), int(n_correct), int(n_total)
        if t < 0 or c < 0 or c > t:
            raise ValueError(f"need 0 <= n_correct <= n_total, got n_correct={n_correct}, n_total={n_total}")
        counts = self._counts.setdefault(pid, [0, 0])
        counts[0] += c
        counts[1] += t
        if self.enabled and pid not in self._removed and counts[1] > 0 and counts[0] / counts[1] >= self.threshold:
            self._removed.add(pid)
            return True
        return False

    def pass_rate(self, prompt_id: int) -> float | None:
        """Historical pass rate of ``prompt_id``, or None if it was never graded."""
        c, t = self._counts.get(int(prompt_id), (0, 0))
        return c / t if t else None

    def is_active(self, prompt_id: int) -> bool:
        """False once the prompt has been removed (only consulted when an epoch's schedule is built)."""
        return int(prompt_id) not in self._removed

    def filter(self, prompt_ids: Iterable[int]) -> list[int]:
        """The active prompt ids among ``prompt_ids``, in their order; call at an epoch boundary."""
        return [p for p in prompt_ids if int(p) not in self._removed]

    @property
    def removed(self) -> frozenset[int]:
        """Ids of the removed prompts."""
        return frozenset(self._removed)

    def stats(self) -> dict[str, int]:
        """``{"n_tracked": prompts with any history, "n_removed": prompts removed}``."""
        return {"n_tracked": len(self._counts), "n_removed": len(self._removed)}

    # -- checkpointing ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (prompt ids become string keys, as JSON requires)."""
        return {
            "version": _VERSION,
            "threshold": self.threshold,
            "enabled": self.enabled,
            "counts": {str(p): [c, t] for p, (c, t) in sorted(self._counts.items())},
            "removed": sorted(self._removed),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this curriculum's state with ``state`` (from :meth:`state_dict`, possibly via JSON)."""
        if int(state.get("version", _VERSION)) != _VERSION:
            raise ValueError(f"unsupported NPRCurriculum state version {state.get('version')!r}")
        self.threshold = float(state["threshold"])
        self.enabled = bool(state["enabled"])
        self._counts = {int(p): [int(c), int(t)] for p, (c, t) in state["counts"].items()}
        self._removed = {int(p) for p in state["removed"]}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> NPRCurriculum:
        """A new curriculum restored from :meth:`state_dict` output."""
        cur = cls(threshold=float(state["threshold"]), enabled=bool(state["enabled"]))
        cur.load_state_dict(state)
        return cur

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NPRCurriculum) and self.state_dict() == other.state_dict()

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"NPRCurriculum(threshold={self.threshold}, enabled={self.enabled}, "
            f"{s['n_tracked']} tracked, {s['n_removed']} removed)"
        )
