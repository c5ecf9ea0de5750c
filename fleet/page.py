"""What both reports' pages are made of: the report itself, plots as inline PNG, and the
self-contained page. fleet/report.py (a bench) and fleet/tune_report.py (a search) import it;
neither imports the other's page parts."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


@dataclass
class Report:
    run_id: str
    note: str
    summary: pd.DataFrame
    failures: pd.DataFrame
    text: str
    files: dict[str, Path] = field(default_factory=dict)
    answer: str = ""  # the run's result in one line: cheapest, fastest, or cannot tell apart
    details: dict[str, Any] = field(default_factory=dict)  # the kind's own findings, for --json

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "note": self.note,
            "answer": self.answer,
            **self.details,
            "summary": self.summary.replace({np.nan: None}).to_dict(orient="records"),
            "failures": self.failures.to_dict(orient="records"),
            "files": {k: str(v) for k, v in self.files.items()},
        }


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only (no display here or on a CI machine)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def render_page(
    title: str, note: str, intro: list[str], plots: dict[str, str], tail: list[str]
) -> str:
    """One self-contained page: the local-cloud note first, the plots inline as PNG."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
        "padding:3px 6px}.note{background:#fff3cd;padding:.5em}img{max-width:100%}"
        ".answer{background:#e6f4ea;padding:.6em;font-size:1.15em}"
        "table{display:block;max-width:100%;overflow-x:auto}</style>",
        "</head><body>",
    ]
    if note:
        parts.append(f"<p class='note'>{html.escape(note)}</p>")
    parts.append(f"<h1>{html.escape(title)}</h1>")
    parts += intro
    for name, image in plots.items():
        escaped = html.escape(name)
        parts.append(f"<h2>{escaped}</h2><img alt='{escaped}' src='data:image/png;base64,{image}'>")
    parts += tail
    parts.append("</body></html>")
    return "\n".join(parts)
