"""The capacity searches of a results folder (`testbed capacity` writes each as
`<results>/capacity-*/capacity.json`) as one table: the capacity found, whether every probe's
compute was faithful, the probes, and the playbook's published figure with the reason for a gap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testbed.core.errors import BadInputError
from testbed.metrics.capacity import probes_faithful
from testbed.results.condition_table import PAPER_GAP

CAPACITY_FILE = "capacity.json"
HEADERS = [
    "search", "mode", "rate (tok/s)", "capacity", "faithful", "probes (devices: tok/s)",
    "paper", "ours / paper", "why they differ",
]  # fmt: skip


def capacity_searches(results: Path) -> list[dict[str, Any]]:
    """Every search under `results`, oldest first, each with its folder's name as `search`."""
    found = []
    for path in sorted(Path(results).glob(f"*/{CAPACITY_FILE}")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadInputError(f"{path}: not a capacity search's JSON ({exc})") from exc
        if not isinstance(data, dict) or not {"rate", "capacity", "mode"} <= data.keys():
            raise BadInputError(f"{path}: expected keys rate, capacity and mode")
        found.append({**data, "search": path.parent.name})
    return found


def capacity_rows(searches: list[dict[str, Any]]) -> list[list[str]]:
    """One row per search (see HEADERS); searches older than the probe records show '?'."""
    rows = []
    for s in searches:
        probes = s.get("probes") or [
            {"devices": int(n), "figure": f, "faithful": None}
            for n, f in (s.get("measured") or {}).items()
        ]
        shown = ", ".join(
            f"{p['devices']}: {'-' if p['figure'] is None else format(p['figure'], '.1f')}"
            + ("" if p["faithful"] is not False else " (unfaithful)")
            for p in sorted(probes, key=lambda p: p["devices"])
        )
        known = all(p["faithful"] is not None for p in probes)
        faithful = ("yes" if probes_faithful(probes, s["capacity"]) else "no") if known else "?"
        paper = s.get("paper") or {}
        value = paper.get("value")
        ratio = s["capacity"] / value if value else None
        gap = ratio is not None and abs(ratio - 1) > PAPER_GAP
        why = paper.get("why") or ("(no reason given)" if gap else "")
        capacity = found(s["capacity"], probes)
        if s.get("searched_on") == "twin":
            capacity += (
                f" (twin; {'confirmed' if s.get('confirmed') else 'not confirmed'} on the lab)"
            )
        rows.append([
            s["search"], str(s["mode"]), f"{s['rate']:g}", capacity,
            faithful, shown,
            "-" if value is None else f"{value:g}", "-" if ratio is None else f"{ratio:.2f}", why,
        ])  # fmt: skip
    return rows


def found(capacity: int, probes: list[dict[str, Any]]) -> str:
    """The capacity as found: '< N' when the smallest count probed, N > 1, did not keep the rate."""
    smallest = min((p["devices"] for p in probes), default=1)
    return f"< {smallest}" if capacity == 0 and smallest > 1 else str(capacity)
