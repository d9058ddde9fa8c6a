"""Agent record files -> pandas tables -> Parquet, and the per-condition summary row."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from agents.records import read_records


def frame_from_jsonl(paths: Iterable[Path], **constants: Any) -> pd.DataFrame:
    """Concatenate record files into one frame, adding constant columns (e.g. condition)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows.extend(read_records(path))
    df = pd.DataFrame(rows)
    for key, value in constants.items():
        df[key] = value
    return df


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """Write a frame to Parquet (via a temporary name, so a crash leaves no torn file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)


def _ratio(num: float, den: float) -> float | None:
    return float(num) / float(den) if den else None


def summarize(
    rounds: pd.DataFrame, requests: pd.DataFrame, agents: pd.DataFrame | None = None
) -> dict[str, Any]:
    """Headline figures of one condition from its device round and request tables.

    System throughput counts from the first device agent's start (its handshake included)
    to the last answer, when the agents' status records (`agents`) are given.
    """
    out: dict[str, Any] = {"requests": len(requests), "rounds": len(rounds)}
    if requests.empty:
        return out
    tokens = int(requests["tokens"].sum())
    start = float(requests["t_start"].min())
    if agents is not None and "t_start" in agents:
        start = min(start, float(agents["t_start"].min()))
    span = float(requests["t_end"].max() - start)
    per_dev = requests.groupby("dev").agg(
        tokens=("tokens", "sum"), start=("t_start", "min"), end=("t_end", "max")
    )
    if agents is not None and "t_start" in agents:
        began = agents.set_index("dev")["t_start"].reindex(per_dev.index)
        per_dev["start"] = pd.concat([per_dev["start"], began], axis=1).min(axis=1)
    per_dev_rate = per_dev["tokens"] / (per_dev["end"] - per_dev["start"]).clip(lower=1e-9)
    verified = rounds[rounds["mode"] == "verified"] if not rounds.empty else rounds
    out.update(
        tokens=tokens,
        seconds=span,
        system_tok_s=_ratio(tokens, span),
        device_tok_s_mean=float(per_dev_rate.mean()),
        device_tok_s_min=float(per_dev_rate.min()),
        fallback_share=_ratio(requests["fallback_tokens"].sum(), tokens),
        verified_share=_ratio(requests["verified_tokens"].sum(), tokens),
    )
    if not verified.empty:
        out.update(
            acceptance_rate=_ratio(verified["accepted"].sum(), verified["drafted"].sum()),
            mean_accepted_len=float((verified["accepted"] + 1).mean()),
            mean_batch=float(verified["batch"].mean()),
            verify_rtt_ms_p50=float(verified["rtt_ms"].median()),
            retry_share=_ratio((verified["attempts"] > 1).sum(), len(verified)),
        )
    for col in ("strict_correct", "flexible_correct"):
        if col in requests:
            out[col.replace("_correct", "_accuracy")] = float(requests[col].mean())
    if "matches_target" in requests:
        full = requests[requests["verified_tokens"] == requests["tokens"]]
        out["fully_verified_answers"] = len(full)
        out["target_match_share"] = float(full["matches_target"].mean()) if len(full) else None
    return out
