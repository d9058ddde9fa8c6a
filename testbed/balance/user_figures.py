"""A BALANCE condition's users and figures, from what the devices saw, what the server did
and what the simulator predicted.

Every time is a device's (from a user's first send to its last token), so the network is
inside the latencies: time to first token (TTFT), time per output token after the first
(TPOT), completion. Users in time are those whose device had every token within the
deadline. Memory is in GB of the hardware the server stands for.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from agents.balance.modes import MODE_NAMES
from agents.balance.rescue import MOVED_TO_AD
from agents.balance.serve import ServeResult
from agents.emulation.stepcost import GB
from testbed.balance.over_link import OverLink
from testbed.config.playbook import BalanceSection
from testbed.core.stats import percentile

MIB = 2**20
SERVED = ("AD", "SD")


def _latencies(r: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(TTFT, TPOT, completion) of one device record, in seconds (None where it has none)."""
    send, first, done = r.get("t_send"), r.get("t_first_token"), r.get("t_done")
    ttft = first - send if first is not None and send is not None else None
    n = int(r.get("tokens") or 0)
    finished = r.get("outcome") == "done" and done is not None and send is not None
    tpot = (done - first) / (n - 1) if finished and first is not None and n > 1 else None
    return ttft, tpot, (done - send) if finished else None


def user_table(rows: list[dict[str, Any]], seen: list[dict[str, Any]],
               served: list[dict[str, Any]], predicted: tuple[OverLink, ServeResult],
               cid: str) -> pd.DataFrame:  # fmt: skip
    """One row per user: its request, what its device saw, what the server did, and the
    simulator's prediction (its first draw)."""
    on_device = {r["uid"]: r for r in seen}
    at_server = {r["uid"]: r for r in served}
    drawn, result = predicted
    done_at = drawn.completion_s(result.finish)
    met = drawn.met(result.finish)
    out = []
    for r in rows:
        uid = r["uid"]
        d, s = on_device.get(uid, {}), at_server.get(uid, {})
        ttft, tpot, completion = _latencies(d)
        finished = d.get("outcome") == "done"
        out.append({
            "condition": cid, "uid": uid, "dev": r["dev"], "problem": r["problem"],
            "send_s": r["arrive_s"], "deadline_s": r["deadline_s"],
            "prompt_tokens": len(r["prompt"]), "output_tokens": r["output"],
            "outcome": d.get("outcome") or "no record", "mode": d.get("mode") or None,
            "admission": d.get("reason") or s.get("admission"), "attempts": d.get("attempts"),
            "ttft_s": ttft, "tpot_s": tpot, "completion_s": completion,
            "met": bool(d.get("met", False)),
            "matches_target": (d.get("ids") == r["reference"]) if finished else None,
            "server_asks": s.get("asks"), "server_deadline_s": s.get("server_deadline_s"),
            "server_completion_s": s.get("completion_s"), "told_srtt_ms": s.get("srtt_ms"),
            "told_loss": s.get("loss"),
            "predicted_mode": MODE_NAMES[int(result.mode[uid])],
            "predicted_completion_s": float(done_at[uid]) if np.isfinite(done_at[uid]) else None,
            "predicted_met": bool(met[uid]),
        })  # fmt: skip
    return pd.DataFrame(out)


def _ms(values: pd.Series, q: float) -> float | None:
    v = percentile(values.dropna().to_numpy(dtype=float), q)
    return None if v is None else v * 1000


def _relative(predicted: float, measured: float) -> float | None:
    return predicted / measured - 1 if measured else None


def condition_metrics(users: pd.DataFrame, summary: dict[str, Any],
                      predicted: list[tuple[OverLink, ServeResult]], b: BalanceSection,
                      ceiling: int, span_s: float) -> dict[str, Any]:  # fmt: skip
    """The condition's figures: users in time, latencies, memory against the budget, and the
    simulator's prediction (the mean over its draws) beside each.

    `ceiling`: users some mode could serve in time alone, which no policy exceeds; `span_s`:
    from the first send to the latest deadline, the same under every policy (task throughput
    is users in time over it)."""
    done = users[users["outcome"] == "done"]
    in_time = int(users["met"].sum())
    modes = done["mode"]
    predicted_in_time = float(np.mean([o.met(r.finish).sum() for o, r in predicted]))
    predicted_done = [o.completion_s(r.finish) for o, r in predicted]
    predicted_mean = float(np.mean([np.nanmean(c) if np.isfinite(c).any() else np.nan
                                    for c in predicted_done]))  # fmt: skip
    measured_mean = float(done["completion_s"].mean()) if len(done) else None
    budget = b.memory_gb * GB
    peak = max(summary["peak_reserved_bytes"], summary["peak_held_bytes"])
    return {
        "policy": b.policy,
        "users": len(users),
        "done": len(done),
        "served_in_time": in_time,
        "late": len(done) - in_time,
        "refused": int((users["outcome"] == "refused").sum()),
        "rejected": int((users["outcome"] == "rejected").sum()),
        "unanswered": int(users["outcome"].isin(["unanswered", "no record"]).sum()),
        "ad_users": int((modes == "AD").sum()),
        "sd_users": int((modes == "SD").sum()),
        "moved_to_ad": int(done["admission"].fillna("").str.contains(MOVED_TO_AD).sum()),
        "servable_alone": ceiling,
        "retried_users": int((users["attempts"].fillna(1) > 1).sum()),
        "ttft_p50_ms": _ms(done["ttft_s"], 50),
        "ttft_p90_ms": _ms(done["ttft_s"], 90),
        "ttft_p99_ms": _ms(done["ttft_s"], 99),
        "tpot_p50_ms": _ms(done["tpot_s"], 50),
        "tpot_p90_ms": _ms(done["tpot_s"], 90),
        "tpot_p99_ms": _ms(done["tpot_s"], 99),
        "completion_mean_s": measured_mean,
        "span_s": span_s,
        "task_throughput": in_time / span_s if span_s else 0.0,
        "outputs_equal_target": int(done["matches_target"].fillna(False).astype(bool).sum()),
        "memory_budget_gb": b.memory_gb,
        "peak_held_gb": summary["peak_held_bytes"] / GB,
        "peak_reserved_gb": summary["peak_reserved_bytes"] / GB,
        "memory_within_budget": bool(peak <= budget),
        "rss_growth_mib": (summary["rss_peak_bytes"] - summary["rss_loaded_bytes"]) / MIB,
        "told_srtt_ms": percentile(users["told_srtt_ms"].dropna().to_numpy(dtype=float), 50),
        "told_loss_mean": float(users["told_loss"].mean()) if users["told_loss"].notna().any()
        else None,
        "server_refusals": sum(summary.get("refusals", {}).values()),
        "loop_behind_max_ms": summary["most_behind_s"] * 1000,
        "steal_ms": summary["steal_ms"],
        "predicted_served_in_time": predicted_in_time,
        "in_time_error": _relative(predicted_in_time, in_time),
        "predicted_completion_mean_s": predicted_mean,
        "completion_mean_error": _relative(predicted_mean, measured_mean)
        if measured_mean else None,
    }  # fmt: skip


def describe(cid: str, b: BalanceSection, m: dict[str, Any]) -> str:
    """One console line: what the condition served, how fast, in what memory, and how well
    the simulator predicted it."""

    def fmt(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    return (
        f"{cid}: {b.policy}, {m['users']} users, {b.memory_gb:g} GB: {m['served_in_time']} in "
        f"time (simulated {m['predicted_served_in_time']:.1f}) of {m['servable_alone']} a mode "
        f"could serve alone; {m['ad_users']} AD ({m['moved_to_ad']} moved from SD), "
        f"{m['sd_users']} SD, {m['refused']} refused, {m['late']} late, "
        f"{m['unanswered']} unanswered; TTFT p50 {fmt(m['ttft_p50_ms'], '.0f')} ms, TPOT p50 "
        f"{fmt(m['tpot_p50_ms'], '.1f')} ms; completion {fmt(m['completion_mean_s'], '.2f')} s "
        f"(simulated {fmt(m['predicted_completion_mean_s'], '.2f')} s); task throughput "
        f"{m['task_throughput']:.2f}/s; peak memory {m['peak_held_gb']:.3f} GB held / "
        f"{m['peak_reserved_gb']:.3f} GB reserved of {b.memory_gb:g} GB"
    )
