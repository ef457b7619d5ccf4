"""matplotlib set up for the charts every task draws: headless, SVG text as text, the same
bytes for the same chart."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib's pyplot, headless, writing SVG text as text with stable ids."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text: readable and searchable
    plt.rcParams["svg.hashsalt"] = "grail"  # stable ids: same input, same file
    return plt


def save_svg(fig, path: Path) -> None:
    """Save and close: no date in the file, so the same chart gives the same bytes."""
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    pyplot().close(fig)
