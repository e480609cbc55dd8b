"""Writing the analysis figures: one place that saves a matplotlib figure to a file and frees it."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, path, dpi: int = 120) -> Path:
    """Lay out `fig`, write it to `path` (its folder made if missing), close it; the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)  # a figure left open holds its memory until the process ends
    return path
