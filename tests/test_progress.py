"""The console progress line's ETA: the rate counts only steps taken since the line was made (a resumed run's
earlier steps took no time here), and no step yet means no ETA rather than a huge number."""

import io

from scalerl_jax import metrics
from scalerl_jax.metrics import Progress


def _line(p: Progress, step: int, now: float, monkeypatch) -> str:
    monkeypatch.setattr(metrics.time, "time", lambda: now)
    p.update(step, force=True)
    return p.stream.getvalue().splitlines()[-1]


def test_eta_counts_from_the_start_step(monkeypatch):
    monkeypatch.setattr(metrics.time, "time", lambda: 100.0)
    p = Progress(100, desc="rl", stream=io.StringIO(), start=40)
    assert _line(p, 40, 130.0, monkeypatch).endswith("40/100  eta     ?")  # no step taken yet
    # 10 steps in 20 s since the start (step 40): 2 s a step, 50 steps left -> 100 s (not 20 / 50 * 50 = 20 s)
    assert _line(p, 50, 120.0, monkeypatch).endswith("eta   100s")


def test_a_fresh_run_with_no_step_shows_no_eta(monkeypatch):
    monkeypatch.setattr(metrics.time, "time", lambda: 0.0)
    p = Progress(6, desc="rl", stream=io.StringIO())
    assert _line(p, 0, 5.0, monkeypatch).endswith("eta     ?")
    assert _line(p, 3, 6.0, monkeypatch).endswith("eta     6s")  # 3 steps in 6 s, 3 left
