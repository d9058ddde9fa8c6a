"""Draw a `Chart` with matplotlib and save it as PNG and SVG."""

from __future__ import annotations

from pathlib import Path

from testbed.report.charts import Chart

FORMATS = ("png", "svg")


def _xy(xs: list[float], ys: list[float | None]) -> tuple[list[float], list[float]]:
    pairs = [(x, y) for x, y in zip(xs, ys) if y is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def save_chart(chart: Chart, folder: Path) -> list[Path]:
    """Write folder/<key>.png and .svg; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    try:
        for i, s in enumerate(chart.series):
            color = f"C{i}"
            x, y = _xy(s.x, s.y)
            if s.style == "points":
                ax.plot(x, y, "o", color=color, label=s.name, markersize=4)
            elif s.style == "step":
                ax.step(x, y, where="post", color=color, label=s.name)
            else:
                ax.plot(x, y, "-o", color=color, label=s.name, markersize=3)
            if s.low is not None and s.high is not None:
                band = [
                    (xv, lo, hi)
                    for xv, lo, hi in zip(s.x, s.low, s.high)
                    if lo is not None and hi is not None
                ]
                if band:
                    bx, blo, bhi = zip(*band)
                    ax.fill_between(bx, blo, bhi, color=color, alpha=0.2, linewidth=0)
        for j, ref in enumerate(chart.refs):
            ax.axhline(ref.y, linestyle="--", color=f"C{len(chart.series) + j}", label=ref.name)
        ax.set_title(chart.title)
        ax.set_xlabel(chart.xlabel)
        ax.set_ylabel(chart.ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        if chart.note:
            fig.text(0.01, 0.01, chart.note, fontsize=6.5, color="0.35", wrap=True)
        fig.tight_layout(rect=(0, 0.05 if chart.note else 0, 1, 1))
        paths = []
        for fmt in FORMATS:
            path = folder / f"{chart.key}.{fmt}"
            fig.savefig(path, metadata={"Date": None} if fmt == "svg" else None)
            paths.append(path)
        return paths
    finally:
        plt.close(fig)
