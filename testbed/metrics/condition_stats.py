"""One stats object per condition, shaped like vLLM's spec-decode metrics: counts gathered
once from the typed tables, every derived figure a property whose docstring is its formula.

Clocks: every duration is the difference of two times written by the *same host*. A device's
span runs from its agent's start (handshake included) to its last answer, on its own clock.
The system span is the longest device span; system rates divide by it, so no time of one
host is ever subtracted from a time of another (the devices are started together by the
controller, so the longest span bounds the run's length from below). The figures that must
set hosts against each other (a device's reaction to a link change, a failover after a cut:
`testbed.metrics.link_reaction`) move each time onto the controller's clock first; the row
carries the largest offset applied and error bound (`testbed.metrics.clocks.clock_figures`).

Tokens: *verified* tokens came out of a verdict of the target (accepted drafts plus the
correction or bonus token); *unverified* tokens are draft tokens a device kept while the
server was unreachable (fallback) or that never met a server (device-only mode, rounds
`local`). Tokens of the server-alone modes (server-ad, server-sd) are the target's: verified.
Total = verified + unverified. Rates are given for each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from agents.spec.rates import acceptance_rate, mean_accepted_length, per_token_acceptance
from testbed.config.costs import CostTable
from testbed.config.slo import Slo
from testbed.core.stats import percentile, wilson_interval
from testbed.metrics.clocks import ClockOffset, clock_figures, offsets_by_host
from testbed.metrics.link_reaction import failovers_s

PERCENTILES = (50, 90, 99)
MAX_BEHIND_SHARE = 0.01  # a condition with more forwards behind its model is unfaithful
UNVERIFIED_ROUNDS = ("fallback", "local")  # round modes whose drafts no target checked
LATENCIES = ("ttft", "tpot", "itl", "e2e")


def request_latencies(requests: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """Per-request latencies in seconds (NaN where undefined), each on the device's own clock.

    - e2e  = request t_end - request start
    - ttft = t_end of the request's first round that added a token - request start
    - tpot = (e2e - ttft) / (tokens - 1), for requests of two tokens or more

    The request start is its arrival (`t_arrival`, open-loop workloads: waiting counts) where
    recorded, else `t_start`. Rows align with `requests`.
    """
    firsts = emission_times(rounds)
    start = requests["t_start"].to_numpy(dtype=float)
    if "t_arrival" in requests:
        start = np.where(requests["t_arrival"].isna(), start, requests["t_arrival"].astype(float))
    e2e = requests["t_end"].to_numpy(dtype=float) - start
    first = np.array(
        [
            firsts[k][0] if len(firsts.get(k, ())) else np.nan
            for k in zip(requests["dev"], requests["problem"])
        ],
        dtype=float,
    )
    ttft = first - start
    tokens = requests["tokens"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(tokens > 1, (e2e - ttft) / (tokens - 1), np.nan)
    return pd.DataFrame({"e2e": e2e, "ttft": ttft, "tpot": tpot}, index=requests.index)


def emission_times(rounds: pd.DataFrame) -> dict[tuple[str, str], np.ndarray]:
    """(dev, problem) -> t_end of each round that added a token, in round order."""
    if rounds.empty:
        return {}
    emitting = rounds[rounds["tokens"] > 0].sort_values("round")
    return {
        (str(d), str(p)): g["t_end"].to_numpy(dtype=float)
        for (d, p), g in emitting.groupby(["dev", "problem"])
    }


def inter_token_latencies(rounds: pd.DataFrame) -> np.ndarray:
    """itl = t_end of a token-adding round - t_end of the previous token-adding round of the
    same request (one device clock; a round's tokens reach the user together, as one chunk)."""
    gaps = [np.diff(t) for t in emission_times(rounds).values()]
    return np.concatenate(gaps) if gaps else np.zeros(0)


def draft_confidences(conf: pd.Series) -> np.ndarray:
    """Every drafted token's probability under the drafter (the `conf` lists of the rounds)."""
    values = [float(c) for row in conf.dropna() for c in np.atleast_1d(row)]
    return np.asarray(values, dtype=float)


def meets_slo(latencies: pd.DataFrame, slo: Slo) -> np.ndarray:
    """Per request: True when within every limit `slo` gives (an undefined TTFT or TPOT, as
    for an answer without tokens, fails a limit on it)."""
    ok = np.ones(len(latencies), dtype=bool)
    for column, limit_s in (
        ("e2e", slo.e2e_s),
        ("ttft", None if slo.ttft_ms is None else slo.ttft_ms / 1000),
        ("tpot", None if slo.tpot_ms is None else slo.tpot_ms / 1000),
    ):
        if limit_s is not None:
            ok &= latencies[column].to_numpy(dtype=float) <= limit_s
    return ok


@dataclass
class ConditionStats:
    """Counts of one condition; every figure derived from them is a property below."""

    devices: int = 0
    requests: int = 0
    tokens: int = 0
    verified_tokens: int = 0
    unverified_tokens: int = 0
    span_s: float = 0.0  # longest device span (one clock per device)
    device_spans_s: dict[str, float] = field(default_factory=dict)
    device_tokens: dict[str, int] = field(default_factory=dict)
    device_verified_tokens: dict[str, int] = field(default_factory=dict)
    verified_rounds: int = 0
    fallback_rounds: int = 0
    drafted: int = 0  # drafts of verified rounds
    accepted: int = 0
    rejections: int = 0  # verified rounds that accepted fewer drafts than they sent
    prompt_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per request
    answer_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per request
    held: int = 0  # requests held to an asked answer length (workload.stands_for)
    held_short: int = 0  # of them, answers that came out shorter than asked
    draft_lengths: dict[int, int] = field(default_factory=dict)  # drafted -> rounds, all rounds
    confidences: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per drafted token
    latencies_s: dict[str, np.ndarray] = field(default_factory=dict)
    scored: int = 0  # requests with a reference answer
    strict_correct: int = 0
    flexible_correct: int = 0
    target_scored: int = 0  # requests whose target answer was scored
    target_strict_correct: int = 0
    target_flexible_correct: int = 0
    target_compared: int = 0  # requests compared with the target's own greedy answer
    target_matches: int = 0
    verified_answers: int = 0  # answers made only of verified tokens
    verified_answer_matches: int = 0
    slo_met: int = 0
    slo_met_tokens: int = 0
    cost_usd: float | None = None
    hosts: int = 0  # hosts in the hosts table (devices and server)
    measured_hosts: int = 0  # hosts that reported measured power (agents.power)
    energy_j: float | None = None  # measured energy summed over those hosts
    paced_forwards: int = 0  # forwards paced to the emulated hardware (pacing table)
    behind_forwards: int = 0  # of those, forwards whose real computation overran the model
    reactions_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per link change
    failovers_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per failover
    clocks: list[ClockOffset] = field(default_factory=list)  # every offset applied

    # -- throughput -------------------------------------------------------------------------
    def _rate(self, tokens: int) -> float | None:
        return tokens / self.span_s if self.span_s > 0 else None

    @property
    def system_tok_s(self) -> float | None:
        """total tokens / span_s"""
        return self._rate(self.tokens)

    @property
    def system_verified_tok_s(self) -> float | None:
        """verified tokens / span_s"""
        return self._rate(self.verified_tokens)

    @property
    def system_unverified_tok_s(self) -> float | None:
        """unverified (fallback) tokens / span_s"""
        return self._rate(self.unverified_tokens)

    def _per_device(self, tokens: dict[str, int], reduce: Any) -> float | None:
        rates = [tokens.get(d, 0) / s for d, s in self.device_spans_s.items() if s > 0]
        return float(reduce(rates)) if rates else None

    @property
    def device_tok_s_mean(self) -> float | None:
        """mean over devices of (device tokens / device span)"""
        return self._per_device(self.device_tokens, np.mean)

    @property
    def device_tok_s_min(self) -> float | None:
        """min over devices of (device tokens / device span)"""
        return self._per_device(self.device_tokens, np.min)

    @property
    def device_verified_tok_s_min(self) -> float | None:
        """min over devices of (device verified tokens / device span): capacity's figure"""
        return self._per_device(self.device_verified_tokens, np.min)

    @property
    def device_verified_tok_s_mean(self) -> float | None:
        """mean over devices of (device verified tokens / device span)"""
        return self._per_device(self.device_verified_tokens, np.mean)

    # -- speculation ------------------------------------------------------------------------
    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted over verified rounds (agents.spec.rates)"""
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def mean_accepted_length(self) -> float | None:
        """(accepted + verified_rounds) / verified_rounds: with the bonus/correction token"""
        return mean_accepted_length(self.accepted, self.verified_rounds)

    @property
    def acceptance_alpha(self) -> float | None:
        """accepted / (accepted + rejections): the per-token acceptance, independent of the
        draft length (agents.spec.rates), what a stood-for pair's is compared with"""
        return per_token_acceptance(self.accepted, self.rejections)

    # -- request shape ----------------------------------------------------------------------
    @property
    def prompt_tokens_mean(self) -> float | None:
        """mean prompt length of the answered requests, tokens"""
        return float(self.prompt_lengths.mean()) if len(self.prompt_lengths) else None

    @property
    def answer_tokens_mean(self) -> float | None:
        """mean answer length (tokens out) of the answered requests"""
        return float(self.answer_lengths.mean()) if len(self.answer_lengths) else None

    @property
    def answer_tokens_p50(self) -> float | None:
        """median answer length, tokens"""
        return percentile(self.answer_lengths, 50)

    @property
    def answer_tokens_p90(self) -> float | None:
        """90th percentile of the answer lengths, tokens"""
        return percentile(self.answer_lengths, 90)

    @property
    def held_short_share(self) -> float | None:
        """held requests whose answer came out shorter than the length asked / held requests
        (0 expected: a held answer runs to its length)"""
        return self.held_short / self.held if self.held else None

    @property
    def fallback_share(self) -> float | None:
        """unverified tokens / total tokens"""
        return self.unverified_tokens / self.tokens if self.tokens else None

    @property
    def fallback_round_share(self) -> float | None:
        """unverified (fallback or local) rounds / (verified + unverified rounds)"""
        n = self.verified_rounds + self.fallback_rounds
        return self.fallback_rounds / n if n else None

    @property
    def draft_length_mean(self) -> float | None:
        """sum(g * rounds_g) / sum(rounds_g) over all rounds"""
        n = sum(self.draft_lengths.values())
        return sum(g * c for g, c in self.draft_lengths.items()) / n if n else None

    def confidence_percentile(self, q: float) -> float | None:
        """q-th percentile of the drafter's probability of each drafted token"""
        return percentile(self.confidences, q)

    # -- latency ----------------------------------------------------------------------------
    def latency_ms(self, kind: str, q: float) -> float | None:
        """q-th percentile of `kind` (ttft, tpot, e2e: request_latencies; itl:
        inter_token_latencies), in ms"""
        value = percentile(self.latencies_s.get(kind, np.zeros(0)), q)
        return value * 1000 if value is not None else None

    @property
    def slo_attainment(self) -> float | None:
        """requests meeting the SLO / requests"""
        return self.slo_met / self.requests if self.requests else None

    @property
    def goodput_req_s(self) -> float | None:
        """requests meeting the SLO / span_s"""
        return self._rate(self.slo_met)

    @property
    def goodput_tok_s(self) -> float | None:
        """tokens of requests meeting the SLO / span_s"""
        return self._rate(self.slo_met_tokens)

    # -- answers ----------------------------------------------------------------------------
    @property
    def strict_accuracy(self) -> float | None:
        """strict_correct / scored (lm-eval-harness `#### N` match)"""
        return self.strict_correct / self.scored if self.scored else None

    @property
    def flexible_accuracy(self) -> float | None:
        """flexible_correct / scored (lm-eval-harness last-number match)"""
        return self.flexible_correct / self.scored if self.scored else None

    @property
    def target_strict_accuracy(self) -> float | None:
        """target_strict_correct / target_scored: the target's own greedy answers to the same
        problems, scored alike (what answers equal at 0 % loss)"""
        return self.target_strict_correct / self.target_scored if self.target_scored else None

    @property
    def target_flexible_accuracy(self) -> float | None:
        """target_flexible_correct / target_scored"""
        return self.target_flexible_correct / self.target_scored if self.target_scored else None

    @property
    def strict_ci(self) -> tuple[float, float] | None:
        """95 % Wilson interval of strict_accuracy"""
        return wilson_interval(self.strict_correct, self.scored)

    @property
    def flexible_ci(self) -> tuple[float, float] | None:
        """95 % Wilson interval of flexible_accuracy"""
        return wilson_interval(self.flexible_correct, self.scored)

    @property
    def target_match_share(self) -> float | None:
        """answers equal to the target's own greedy answer / answers compared (all answers)"""
        return self.target_matches / self.target_compared if self.target_compared else None

    @property
    def verified_answer_match_share(self) -> float | None:
        """among answers made only of verified tokens, the share equal to the target's
        (1.0 when speculative decoding is lossless)"""
        if not self.verified_answers:
            return None
        return self.verified_answer_matches / self.verified_answers

    # -- cost -------------------------------------------------------------------------------
    @property
    def cost_per_1k_tokens(self) -> float | None:
        """cost_usd / total tokens * 1000 (see testbed.config.costs)"""
        return (
            self.cost_usd / self.tokens * 1000
            if self.cost_usd is not None and self.tokens
            else None
        )

    @property
    def cost_per_1k_verified_tokens(self) -> float | None:
        """cost_usd / verified tokens * 1000"""
        if self.cost_usd is None or not self.verified_tokens:
            return None
        return self.cost_usd / self.verified_tokens * 1000

    @property
    def energy_per_1k_tokens_j(self) -> float | None:
        """energy_j / total tokens * 1000: measured joules per 1,000 tokens, over the hosts
        that report power (all of them only when measured_hosts == hosts)"""
        if self.energy_j is None or not self.tokens:
            return None
        return self.energy_j / self.tokens * 1000

    @property
    def cost_power(self) -> str:
        """the power behind cost_usd: "measured" (every host), "nominal" (the class table's
        figures for every host) or "measured on k of n hosts" (nominal for the rest)"""
        if self.measured_hosts == 0:
            return "nominal"
        if self.measured_hosts == self.hosts:
            return "measured"
        return f"measured on {self.measured_hosts} of {self.hosts} hosts"

    # -- compute emulation ------------------------------------------------------------------
    @property
    def behind_share(self) -> float | None:
        """behind_forwards / paced_forwards: forwards slower than the hardware they stand for"""
        return self.behind_forwards / self.paced_forwards if self.paced_forwards else None

    @property
    def compute_faithful(self) -> bool | None:
        """behind_share <= MAX_BEHIND_SHARE (1 %): the hosts computed as fast as the hardware
        they stand for; None where nothing was paced (real hardware)"""
        share = self.behind_share
        return None if share is None else share <= MAX_BEHIND_SHARE

    # -- links, across hosts (controller clock) ---------------------------------------------
    @property
    def link_reaction_p50_s(self) -> float | None:
        """median over the devices' link changes and failovers of reaction_s: to the end of
        the device's first round begun after it (metrics.link_reaction)"""
        return percentile(self.reactions_s, 50)

    @property
    def link_reaction_max_s(self) -> float | None:
        """the slowest reaction_s (metrics.link_reaction)"""
        return float(self.reactions_s.max()) if len(self.reactions_s) else None

    @property
    def failover_max_s(self) -> float | None:
        """the slowest failover: from the last change of the device's primary link (the cut)
        to the monitor's failover (metrics.link_reaction)"""
        return float(self.failovers_s.max()) if len(self.failovers_s) else None

    # -- outputs ----------------------------------------------------------------------------
    def as_row(self) -> dict[str, Any]:
        """Flat figures for the conditions table (one column each)."""
        row: dict[str, Any] = {
            "devices": self.devices,
            "requests": self.requests,
            "tokens": self.tokens,
            "verified_tokens": self.verified_tokens,
            "unverified_tokens": self.unverified_tokens,
            "span_s": self.span_s,
            "verified_rounds": self.verified_rounds,
            "fallback_rounds": self.fallback_rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "scored": self.scored,
            "cost_usd": self.cost_usd,
            "hosts": self.hosts,
            "measured_hosts": self.measured_hosts,
            "energy_j": self.energy_j,
            "paced_forwards": self.paced_forwards,
            "behind_forwards": self.behind_forwards,
        }
        for name in DERIVED:
            row[name] = getattr(self, name)
        for kind in LATENCIES:
            for q in PERCENTILES:
                row[f"{kind}_p{q}_ms"] = self.latency_ms(kind, q)
        for q in (10, 50, 90):
            row[f"draft_confidence_p{q}"] = self.confidence_percentile(q)
        for name in ("strict", "flexible"):
            ci = getattr(self, f"{name}_ci")
            row[f"{name}_ci_low"], row[f"{name}_ci_high"] = ci if ci else (None, None)
        return row | clock_figures(self.clocks)

    @classmethod
    def from_frames(
        cls,
        rounds: pd.DataFrame,
        requests: pd.DataFrame,
        hosts: pd.DataFrame | None = None,
        slo: Slo | None = None,
        costs: CostTable | None = None,
        pacing: pd.DataFrame | None = None,
        changes: pd.DataFrame | None = None,
    ) -> ConditionStats:
        """Gather the counts from a condition's rounds, requests, hosts, pacing and
        link_changes tables (the latter with its `reaction_s`)."""
        s = cls()
        s.paced_forwards, s.behind_forwards = pacing_counts(pacing)
        s.clocks = used_clocks(hosts, changes)
        if changes is not None and "reaction_s" in changes:  # (runs before it have none)
            s.reactions_s = changes["reaction_s"].dropna().to_numpy(dtype=float)
            s.failovers_s = failovers_s(changes)
        if requests.empty:
            return s
        s.requests = len(requests)
        s.tokens = int(requests["tokens"].sum())
        s.verified_tokens = int(requests["verified_tokens"].sum())
        s.unverified_tokens = int(requests["fallback_tokens"].sum())
        s.answer_lengths = requests["tokens"].to_numpy(dtype=float)
        if "prompt_tokens" in requests:
            s.prompt_lengths = requests["prompt_tokens"].to_numpy(dtype=float)
        if "asked_tokens" in requests:
            asked = requests["asked_tokens"].notna()
            s.held = int(asked.sum())
            s.held_short = int((requests["tokens"][asked] < requests["asked_tokens"][asked]).sum())
        per_dev = requests.groupby("dev").agg(
            tokens=("tokens", "sum"),
            verified=("verified_tokens", "sum"),
            start=("t_start", "min"),
            end=("t_end", "max"),
        )
        if hosts is not None and not hosts.empty and "t_start" in hosts:
            own = hosts[hosts["role"] == "device"] if "role" in hosts else hosts
            began = own.groupby("dev")["t_start"].min().reindex(per_dev.index)
            per_dev["start"] = np.fmin(per_dev["start"], began)
        spans = per_dev["end"] - per_dev["start"]
        s.devices = len(per_dev)
        s.device_spans_s = {str(d): float(v) for d, v in spans.items()}
        s.device_tokens = {str(d): int(v) for d, v in per_dev["tokens"].items()}
        s.device_verified_tokens = {str(d): int(v) for d, v in per_dev["verified"].items()}
        s.span_s = float(spans.max())
        if not rounds.empty:
            verified = rounds[rounds["mode"] == "verified"]
            drafting = rounds[rounds["mode"].isin(["verified", *UNVERIFIED_ROUNDS])]
            s.verified_rounds = len(verified)
            s.fallback_rounds = int(rounds["mode"].isin(UNVERIFIED_ROUNDS).sum())
            s.drafted = int(verified["drafted"].sum())
            s.accepted = int(verified["accepted"].sum())
            s.rejections = int((verified["accepted"] < verified["drafted"]).sum())
            counts = drafting["drafted"].value_counts()
            s.draft_lengths = {int(g): int(n) for g, n in counts.items()}
            if "conf" in rounds:
                s.confidences = draft_confidences(drafting["conf"])
        lat = request_latencies(requests, rounds)
        s.latencies_s = {k: lat[k].dropna().to_numpy() for k in ("e2e", "ttft", "tpot")}
        s.latencies_s["itl"] = inter_token_latencies(rounds)
        for prefix, count in (("", "scored"), ("target_", "target_scored")):
            for name in ("strict", "flexible"):
                col = requests.get(f"{prefix}{name}_correct")
                if col is not None and col.notna().any():
                    setattr(s, count, int(col.notna().sum()))
                    correct = int(col.dropna().astype(bool).sum())
                    setattr(s, f"{prefix}{name}_correct", correct)
        if "matches_target" in requests and requests["matches_target"].notna().any():
            match = requests["matches_target"].dropna().astype(bool)
            s.target_compared, s.target_matches = len(match), int(match.sum())
            full = requests[requests["verified_tokens"] == requests["tokens"]]
            full_match = full["matches_target"].dropna().astype(bool)
            s.verified_answers, s.verified_answer_matches = len(full_match), int(full_match.sum())
        ok = meets_slo(lat, slo or Slo())
        s.slo_met = int(ok.sum())
        s.slo_met_tokens = int(requests["tokens"].to_numpy()[ok].sum())
        s.cost_usd = host_cost(hosts, costs or CostTable())
        s.hosts, s.measured_hosts, s.energy_j = measured_energy(hosts)
        return s


def used_clocks(hosts: pd.DataFrame | None, changes: pd.DataFrame | None) -> list[ClockOffset]:
    """The offsets a condition's figures used: each host's (hosts table) and those that moved
    the link changes onto the controller's clock."""
    used = list(offsets_by_host(hosts).values()) if hosts is not None else []
    if changes is not None and not changes.empty and "clock_offset_s" in changes:
        moved = changes.dropna(subset=["clock_offset_s", "clock_offset_err_s"])
        used += [ClockOffset(float(o), float(e)) for o, e in
                 set(zip(moved["clock_offset_s"], moved["clock_offset_err_s"]))]  # fmt: skip
    return used


def pacing_counts(pacing: pd.DataFrame | None) -> tuple[int, int]:
    """(forwards, behind forwards) of the paced engines in a condition's pacing table."""
    if pacing is None or pacing.empty:
        return 0, 0
    rows = pacing[pacing["paced"].astype(bool)]
    return int(rows["forwards"].sum()), int(rows["behind"].sum())


def pacing_figures(pacing: pd.DataFrame | None) -> dict[str, Any]:
    """A condition's compute-emulation figures alone (modes without device records)."""
    paced, behind = pacing_counts(pacing)
    s = ConditionStats(paced_forwards=paced, behind_forwards=behind)
    return {"paced_forwards": paced, "behind_forwards": behind,
            "behind_share": s.behind_share, "compute_faithful": s.compute_faithful}  # fmt: skip


def host_cost(hosts: pd.DataFrame | None, costs: CostTable) -> float | None:
    """Sum over hosts of (own span in hours) * hourly cost of its class; None when any host's
    class is unknown or no host reported."""
    if hosts is None or hosts.empty or "host_class" not in hosts:
        return None
    total = 0.0
    for h in hosts.itertuples(index=False):
        power = getattr(h, "power_w", None)
        hourly = (
            costs.hourly(h.host_class, None if pd.isna(power) else power)
            if isinstance(h.host_class, str)
            else None
        )
        if hourly is None:
            return None
        total += (h.t_end - h.t_start) / 3600 * hourly
    return total


def measured_energy(hosts: pd.DataFrame | None) -> tuple[int, int, float | None]:
    """(hosts, hosts with measured energy, their energy summed in J; None when none has)."""
    if hosts is None or hosts.empty:
        return 0, 0, None
    if "energy_j" not in hosts:
        return len(hosts), 0, None
    energy = hosts["energy_j"].dropna().astype(float)
    return len(hosts), len(energy), float(energy.sum()) if len(energy) else None


DERIVED = tuple(name for name, value in vars(ConditionStats).items() if isinstance(value, property))
