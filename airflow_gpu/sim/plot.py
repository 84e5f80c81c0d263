"""GPU allocation against arrived GPU demand, policies side by side (like the FGD paper's Fig. 9a)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

GRID = np.arange(0.0, 130.01, 0.5)  # arrived demand, % of GPU capacity


def on_grid(arrived_pct: np.ndarray, allocated_pct: np.ndarray, grid: np.ndarray = GRID) -> np.ndarray:
    """Allocation (%) at each grid point of arrived demand (step function: last pod at or before)."""
    k = np.searchsorted(arrived_pct, grid, side="right") - 1
    return np.where(k >= 0, allocated_pct[np.clip(k, 0, None)], 0.0)


def plot_allocation(curves: dict[str, dict[str, list[np.ndarray]]], path: Path, zoom_from: float = 80.0) -> Path:
    """curves[trace][policy] = list of per-seed allocation arrays on GRID. One panel per trace, the
    mean over seeds per policy; the y axis starts at `zoom_from` % so the policies' gaps show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = sorted(curves)
    cols = min(3, len(traces))
    rows = (len(traces) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    for ax, trace in zip(axes.flat, traces):
        for policy, runs in curves[trace].items():
            mean = np.mean(np.vstack(runs), axis=0)
            ax.plot(GRID, mean, label=f"{policy} ({mean[-1]:.2f}%)", linewidth=1.4)
        ax.plot(GRID, GRID, color="grey", linestyle=":", linewidth=0.8, label="arrived = allocated")
        ax.set_xlim(60, 130)
        ax.set_ylim(zoom_from, 100)
        ax.set_title(trace.removeprefix("openb_pod_list_"))
        ax.set_xlabel("arrived GPU demand (% of capacity)")
        ax.set_ylabel("GPU allocation (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(traces):]:
        ax.axis("off")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
