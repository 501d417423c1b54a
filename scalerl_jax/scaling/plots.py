"""Figures for scaling fits: the fitted curve with bands, A posteriors, the efficiency view, a comparison table.

Every ``plot_*`` function returns a matplotlib Figure; ``save`` writes it as PNG and SVG.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .law import efficiency_F  # noqa: E402

__all__ = ["save", "plot_fit", "plot_A_posteriors", "plot_efficiency", "plot_table", "markdown_table",
           "smooth_density", "plot_forecast"]


def save(fig, out_dir, stem: str) -> list[str]:
    """Write ``fig`` to ``out_dir/stem.png`` and ``.svg``; close it; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        p = out / f"{stem}.{ext}"
        fig.savefig(p, dpi=130, bbox_inches="tight")
        paths.append(str(p))
    plt.close(fig)
    return paths


def plot_fit(curve, posterior, fit_limit, target_compute=None, grid_fit=None, power_fit=None, compute_label="compute"):
    """Observed points (fitted and held out), the fit-window boundary, the posterior mean curve with 50 % and
    90 % bands extrapolated to ``target_compute``, and optionally the grid and power-law fits."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    c, r = curve.compute, curve.reward
    c_end = max(float(c.max()), float(target_compute or 0.0)) * 1.05
    x = np.linspace(0.0, c_end, 300)
    mean, lo90, hi90 = posterior.predict(x, interval=0.9)
    _, lo50, hi50 = posterior.predict(x, interval=0.5)
    ax.fill_between(x, lo90, hi90, color="C0", alpha=0.15, label="90 % band")
    ax.fill_between(x, lo50, hi50, color="C0", alpha=0.3, label="50 % band")
    ax.plot(x, mean, color="C0", lw=2, label="posterior mean")
    inside = c <= fit_limit
    ax.scatter(c[inside], r[inside], s=14, color="k", zorder=3, label="fitted evals")
    if np.any(~inside):
        ax.scatter(c[~inside], r[~inside], s=18, facecolors="none", edgecolors="C3", zorder=3, label="held-out evals")
    ax.axvline(fit_limit, color="gray", ls="--", lw=1, label="end of fit window")
    if target_compute:
        ax.axvline(target_compute, color="C2", ls=":", lw=1.2, label="target compute")
    if grid_fit is not None:
        ax.plot(x, grid_fit.predict(x), color="C1", lw=1, ls="-.", label=f"grid fit (A={grid_fit.A:.3f})")
    if power_fit is not None:
        xp = x[x > 0]
        ax.plot(xp, power_fit.predict(xp), color="C4", lw=1, ls=":", label=f"power law (A={power_fit.A:.3f})")
    s = posterior.summary()["A"]
    ax.axhspan(s["lo"], s["hi"], color="C0", alpha=0.07, lw=0, label="A: 90 % interval")
    ax.axhline(s["mean"], color="C0", lw=0.8, ls=":")
    ax.set_ylim(max(0.0, float(np.min(r)) - 0.05), min(1.0, max(float(np.max(r)), s["hi"]) + 0.05))
    ax.set_xlabel(compute_label)
    ax.set_ylabel("validation reward (mean pass rate)")
    ax.set_title(f"{curve.name}: A = {s['mean']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}] (90 %)")
    ax.legend(fontsize=7, loc="lower right")
    return fig


def _color(i: int, n: int):
    """Distinct colours for up to 20 curves (the default cycle repeats after 10)."""
    return f"C{i}" if n <= 10 else plt.get_cmap("tab20")(i % 20)


def _legend(ax, n: int) -> None:
    """In the axes for a few curves; beside them for many, so the legend never hides the data."""
    if n <= 6:
        ax.legend(fontsize=8)
    else:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def smooth_density(samples, lower: float | None = 0.0, upper: float | None = 1.0, n: int = 400):
    """``(x, density)`` of ``samples`` on ``n`` points: a Gaussian kernel density (Scott's bandwidth, via
    ``scipy.stats.gaussian_kde``) reflected at the support's bounds (A lies in [R0, 1]: without the reflection a
    ceiling posterior piled against 1 would be drawn leaking past it and halved at the edge). Integrates to 1 over
    the support. Degenerate samples (all equal, e.g. a fixed A) give ``(x, None)`` with x the value."""
    from scipy.stats import gaussian_kde

    a = np.asarray(samples, float)
    a = a[np.isfinite(a)]
    if a.size < 2 or np.ptp(a) == 0.0:
        return np.array([float(a[0]) if a.size else float("nan")]), None
    kde = gaussian_kde(a)
    bw = float(np.sqrt(kde.covariance[0, 0]))
    x_lo, x_hi = a.min() - 3 * bw, a.max() + 3 * bw
    if lower is not None:
        x_lo = max(x_lo, lower)
    if upper is not None:
        x_hi = min(x_hi, upper)
    x = np.linspace(x_lo, x_hi, n)
    y = kde(x)
    if lower is not None:
        y = y + kde(2 * lower - x)
    if upper is not None:
        y = y + kde(2 * upper - x)
    return x, y


def plot_A_posteriors(posteriors: dict):
    """Posterior densities of A (the predicted ceilings) for one or several runs on one shared axis: smooth
    densities (:func:`smooth_density`), each run's 90 % interval shaded under its curve and its mean marked."""
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, (name, post) in enumerate(posteriors.items()):
        a = np.asarray(post.samples["A"], float)
        color = _color(i, len(posteriors))
        lo, hi = np.quantile(a, [0.05, 0.95])
        x, dens = smooth_density(a)
        label = f"{name}: {np.mean(a):.3f} [{lo:.3f}, {hi:.3f}]"
        if dens is None:  # A fixed: a spike
            ax.axvline(x[0], color=color, lw=1.8, label=f"{name}: {x[0]:.3f} (fixed)")
            continue
        ax.plot(x, dens, color=color, lw=1.8, label=label)
        inside = (x >= lo) & (x <= hi)
        ax.fill_between(x[inside], dens[inside], color=color, alpha=0.2)
        ax.axvline(float(np.mean(a)), color=color, lw=0.8, ls=":")
    ax.set_xlabel("A (asymptotic reward); shaded: 90 % interval")
    ax.set_ylabel("posterior density")
    ax.set_ylim(bottom=0.0)
    _legend(ax, len(posteriors))
    return fig


def plot_efficiency(items: dict):
    """log F(R) against log C for observed points (F from each run's posterior mean parameters); on the law the
    points lie on the line log F = B log C, so the slope is the run's efficiency B. ``items``: name -> (curve, post)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, (curve, post)) in enumerate(items.items()):
        s = post.summary()
        A, B, Cm = s["A"]["mean"], s["B"]["mean"], s["C_mid"]["mean"]
        R0 = s["R0"]["mean"] if "R0" in s else post.R0
        F = efficiency_F(curve.reward, A, B, Cm, R0)
        ok = np.isfinite(F) & (curve.compute > 0)
        color = _color(i, len(items))
        ax.scatter(np.log(curve.compute[ok]), np.log(F[ok]), s=10, color=color)
        xs = np.log(curve.compute[curve.compute > 0])
        if xs.size:
            xx = np.linspace(xs.min(), xs.max(), 50)
            ax.plot(xx, B * xx, color=color, lw=1.5, label=f"{name}: slope B = {B:.2f}")
    ax.set_xlabel("log C")
    ax.set_ylabel("log F(R)")
    _legend(ax, len(items))
    return fig


def _fmt(s: dict, digits: int = 3, sci: bool = False) -> str:
    f = (lambda v: f"{v:.3g}") if sci else (lambda v: f"{v:.{digits}f}")
    return f"{f(s['mean'])} [{f(s['lo'])}, {f(s['hi'])}]"


def table_rows(posteriors: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows (one per run) of A, B, C_mid with 90 % intervals."""
    header = ["run", "A", "B", "C_mid"]
    rows = []
    for name, post in posteriors.items():
        s = post.summary()
        rows.append([name, _fmt(s["A"]), _fmt(s["B"], 2), _fmt(s["C_mid"], sci=True)])
    return header, rows


def markdown_table(posteriors: dict, pairwise: list[dict] | None = None) -> str:
    """Markdown: A, B, C_mid (mean [90 % interval]) per run, then P(A_i > A_j), P(B_i > B_j) for each pair."""
    header, rows = table_rows(posteriors)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if pairwise:
        lines += ["", "| run 1 | run 2 | P(A1 > A2) | P(B1 > B2) | A1 - A2 |", "|---|---|---|---|---|"]
        for p in pairwise:
            lines.append(
                f"| {p['run_1']} | {p['run_2']} | {p['P_A1_gt_A2']:.3f} | {p['P_B1_gt_B2']:.3f} | {p['dA_mean']:+.3f} |"
            )
    return "\n".join(lines) + "\n"


def plot_table(posteriors: dict, pairwise: list[dict] | None = None):
    """The same table as ``markdown_table`` rendered as an image."""
    header, rows = table_rows(posteriors)
    extra = []
    if pairwise:
        extra = [[f"P({p['run_1']} > {p['run_2']})", f"A: {p['P_A1_gt_A2']:.3f}", f"B: {p['P_B1_gt_B2']:.3f}", ""]
                 for p in pairwise]
    cells = rows + extra
    fig, ax = plt.subplots(figsize=(9, 0.45 * (len(cells) + 1) + 0.4))
    ax.axis("off")
    t = ax.table(cellText=cells, colLabels=header, loc="center", cellLoc="left")
    t.auto_set_font_size(False)
    t.set_fontsize(8)
    t.scale(1, 1.3)
    return fig


def plot_forecast(history: dict, compute_label: str = "compute"):
    """How the live forecast moved (``scaling.forecast.forecast_history``): against the compute at which each
    forecast was made, A's 90 % interval and the predicted final reward's, the observed final reward marked, and
    the compute from which on every interval held it."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    c = np.asarray(history["compute"], dtype=float)
    ax.fill_between(c, history["A_lo"], history["A_hi"], color="C0", alpha=0.2, step="post",
                    label="ceiling A: 90 % interval")
    ax.plot(c, history["A_mean"], color="C0", lw=1.5, drawstyle="steps-post", label="A: posterior mean")
    ax.fill_between(c, history["R_obs_lo"], history["R_obs_hi"], color="C2", alpha=0.12, step="post",
                    label="final eval's measured value: 90 % interval")
    ax.fill_between(c, history["R_target_lo"], history["R_target_hi"], color="C2", alpha=0.3, step="post",
                    label="predicted final reward (mean curve): 90 % interval")
    ax.plot(c, history["R_target_mean"], color="C2", lw=1.5, drawstyle="steps-post", label="predicted final reward")
    if history.get("final_reward") is not None:
        ax.axhline(history["final_reward"], color="k", ls="--", lw=1, label="observed final reward")
    if history.get("held_from_compute") is not None:
        ax.axvline(history["held_from_compute"], color="C3", ls=":", lw=1.2,
                   label="from here on every interval held it")
    ax.set_xlabel(f"{compute_label} when the forecast was made")
    ax.set_ylabel("reward")
    ax.set_ylim(0, 1.02)
    ax.set_title("The live forecast")
    ax.legend(fontsize=7, loc="lower right")
    return fig
