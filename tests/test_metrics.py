"""Each metric's definition, checked on hand-built records with figures worked out by hand."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pyarrow as pa
import pytest

from agents.spec import rates
from testbed.config.costs import CostTable, HostCost
from testbed.config.slo import Slo
from testbed.core.stats import wilson_interval
from testbed.metrics import acceptance_rate, mean_accepted_length
from testbed.metrics.condition_stats import ConditionStats
from testbed.metrics.schemas import RECORDS, SCHEMAS, RoundRecord, schema_of
from testbed.results.tables import typed_table


def rnd(dev, problem, i, t_end, mode, drafted, tokens, accepted=None, conf=None):
    record = RoundRecord(
        condition="c", dev=dev, problem=problem, round=i, t_start=t_end - 0.1,
        t_end=t_end, mode=mode, drafted=drafted, tokens=tokens, accepted=accepted,
    )  # fmt: skip
    return {**dataclasses.asdict(record), "conf": conf}  # the agents' per-draft probabilities


@pytest.fixture
def frames():
    """Two devices on clocks 1000 s apart (as on a lab without clock sync).

    d1 (clock ~0): one request 10.0 -> 11.0, 3 rounds: verified 4 drafted / 3 accepted
      (4 tokens), verified 4/1 (2 tokens), fallback 4 drafted (1 token, cut by EOS) = 7 tokens,
      6 verified. Agent started at 9.0, so its span is 11.0 - 9.0 = 2 s.
    d2 (clock ~1000): one request 1000.0 -> 1000.5, 1 verified round 2/2 (3 tokens).
      Span 0.5 s (agent start 1000.0).
    """
    rounds = pd.DataFrame(
        [
            rnd("d1", "p1", 0, 10.2, "verified", 4, 4, accepted=3, conf=[0.9, 0.8, 0.6, 0.2]),
            rnd("d1", "p1", 1, 10.5, "verified", 4, 2, accepted=1, conf=[0.5, 0.4, 0.3, 0.3]),
            rnd("d1", "p1", 2, 11.0, "fallback", 4, 1, conf=[0.7, 0.7, 0.7, 0.7]),
            rnd("d2", "p2", 0, 1000.5, "verified", 2, 3, accepted=2),
        ]
    )
    requests = pd.DataFrame(
        [
            dict(condition="c", dev="d1", problem="p1", t_start=10.0, t_end=11.0, tokens=7,
                 verified_tokens=6, fallback_tokens=1, rounds=3, strict_correct=True,
                 flexible_correct=True, matches_target=False),
            dict(condition="c", dev="d2", problem="p2", t_start=1000.0, t_end=1000.5, tokens=3,
                 verified_tokens=3, fallback_tokens=0, rounds=1, strict_correct=False,
                 flexible_correct=True, matches_target=True),
        ]
    )  # fmt: skip
    hosts = pd.DataFrame(
        [
            dict(condition="c", dev="d1", t_start=9.0, t_end=11.0, host_class="pi5"),
            dict(condition="c", dev="d2", t_start=1000.0, t_end=1000.5, host_class="pi5"),
        ]
    )
    return rounds, requests, hosts


def test_rates_are_defined_once_and_re_exported():
    assert acceptance_rate is rates.acceptance_rate
    assert mean_accepted_length is rates.mean_accepted_length
    assert acceptance_rate(3, 4) == 0.75 and acceptance_rate(0, 0) is None
    assert mean_accepted_length(6, 3) == 3.0 and mean_accepted_length(0, 0) is None


def test_throughput_splits_verified_and_unverified_on_device_clocks(frames):
    s = ConditionStats.from_frames(*frames)
    assert (s.tokens, s.verified_tokens, s.unverified_tokens) == (10, 9, 1)
    # spans on each device's own clock: 2.0 s and 0.5 s; never 1000.5 - 9.0
    assert s.device_spans_s == {"d1": 2.0, "d2": 0.5}
    assert s.span_s == 2.0
    assert s.system_tok_s == pytest.approx(5.0)
    assert s.system_verified_tok_s == pytest.approx(4.5)
    assert s.system_unverified_tok_s == pytest.approx(0.5)
    assert s.system_verified_tok_s + s.system_unverified_tok_s == pytest.approx(s.system_tok_s)
    assert s.device_tok_s_mean == pytest.approx((7 / 2 + 3 / 0.5) / 2)
    assert s.device_tok_s_min == pytest.approx(3.5)
    assert s.device_verified_tok_s_mean == pytest.approx((6 / 2 + 3 / 0.5) / 2)


def test_acceptance_and_accepted_length_count_verified_rounds_only(frames):
    s = ConditionStats.from_frames(*frames)
    assert (s.verified_rounds, s.fallback_rounds, s.drafted, s.accepted) == (3, 1, 10, 6)
    assert s.acceptance_rate == pytest.approx(0.6)
    # (3+1) + (1+1) + (2+1) over 3 rounds, bonus/correction token included
    assert s.mean_accepted_length == pytest.approx(3.0)
    assert s.fallback_share == pytest.approx(0.1)
    assert s.fallback_round_share == pytest.approx(0.25)
    assert s.draft_lengths == {4: 3, 2: 1}
    assert s.draft_length_mean == pytest.approx(3.5)
    # 12 drafted tokens' probabilities (d2's round has none recorded)
    assert len(s.confidences) == 12
    assert s.confidence_percentile(50) == pytest.approx(0.65)


def test_latencies_follow_their_definitions(frames):
    s = ConditionStats.from_frames(*frames)
    # d1: ttft 0.2 s, e2e 1.0 s, tpot (1.0-0.2)/6; itl 0.3, 0.5. d2: ttft=e2e=0.5, tpot 0
    assert sorted(s.latencies_s["ttft"]) == pytest.approx([0.2, 0.5])
    assert sorted(s.latencies_s["e2e"]) == pytest.approx([0.5, 1.0])
    assert sorted(s.latencies_s["tpot"]) == pytest.approx([0.0, 0.8 / 6])
    assert sorted(s.latencies_s["itl"]) == pytest.approx([0.3, 0.5])
    assert s.latency_ms("ttft", 50) == pytest.approx(350.0)
    assert s.latency_ms("itl", 99) == pytest.approx(300 + 0.99 * 200)


def test_goodput_counts_only_requests_within_every_slo(frames):
    s = ConditionStats.from_frames(*frames, slo=Slo(ttft_ms=300))
    assert (s.slo_met, s.slo_met_tokens) == (1, 7)
    assert s.goodput_req_s == pytest.approx(0.5) and s.goodput_tok_s == pytest.approx(3.5)
    s = ConditionStats.from_frames(*frames, slo=Slo(ttft_ms=300, e2e_s=0.9))
    assert s.slo_met == 0 and s.slo_attainment == 0
    assert ConditionStats.from_frames(*frames).slo_attainment == 1.0


def test_accuracy_has_wilson_intervals_and_target_match_covers_every_answer(frames):
    s = ConditionStats.from_frames(*frames)
    assert (s.strict_accuracy, s.flexible_accuracy) == (0.5, 1.0)
    low, high = s.strict_ci
    assert low < 0.5 < high
    # Wilson for 1/2 at 95 %: (p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)
    z = 1.959963984540054
    n, p = 2, 0.5
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    assert (low, high) == pytest.approx((centre - half, centre + half))
    assert wilson_interval(0, 0) is None
    assert s.target_match_share == 0.5  # over all answers, not just fully verified ones
    assert (s.verified_answers, s.verified_answer_match_share) == (1, 1.0)


def test_cost_per_thousand_tokens_from_host_spans(frames):
    table = CostTable(kwh_price=0.5, classes={"pi5": HostCost(price_per_hour=3.6, power_w=100)})
    s = ConditionStats.from_frames(*frames, costs=table)
    hourly = 3.6 + 0.1 * 0.5
    assert s.cost_usd == pytest.approx(2.5 / 3600 * hourly)
    assert s.cost_per_1k_tokens == pytest.approx(s.cost_usd / 10 * 1000)
    assert s.cost_per_1k_verified_tokens == pytest.approx(s.cost_usd / 9 * 1000)
    rounds, requests, hosts = frames
    hosts.loc[0, "host_class"] = "unknown"
    assert ConditionStats.from_frames(rounds, requests, hosts).cost_usd is None


def test_as_row_has_every_derived_figure(frames):
    row = ConditionStats.from_frames(*frames).as_row()
    for key in ("system_verified_tok_s", "acceptance_rate", "ttft_p99_ms", "strict_ci_low"):
        assert key in row
    assert row["e2e_p50_ms"] == pytest.approx(750.0)


def test_empty_condition_gives_no_figures():
    s = ConditionStats.from_frames(pd.DataFrame(), pd.DataFrame())
    assert s.system_tok_s is None and s.acceptance_rate is None and s.strict_ci is None


def test_schemas_follow_the_record_dataclasses():
    for record in RECORDS:
        schema = SCHEMAS[record.table]
        assert schema.names == [f.name for f in dataclasses.fields(record)]
    rounds = schema_of(RoundRecord)
    assert rounds.field("accepted").nullable and rounds.field("accepted").type == pa.int64()
    assert not rounds.field("dev").nullable


def test_typed_table_casts_fills_and_keeps_extra_columns(frames):
    rounds = frames[0].drop(columns=["draft_len"]).assign(extra=1)
    table = typed_table("rounds", rounds)
    assert table.schema.field("draft_len").type == pa.int64()
    assert table.column("draft_len").null_count == len(rounds)
    assert table.column("conf").type == pa.list_(pa.float64())
    assert table.column("accepted").to_pylist() == [3, 1, None, 2]
    assert table.column_names[-1] == "extra"
    with pytest.raises(ValueError, match="dev"):
        typed_table("rounds", rounds.drop(columns=["dev"]))


def test_centralized_rounds_are_neither_verified_nor_fallback(frames):
    rounds, requests, hosts = frames
    central = pd.DataFrame(
        [{"condition": "c", "dev": "d3", "problem": "p3", "round": 0, "t_start": 5.0,
          "t_end": 6.0, "mode": "centralized", "tokens": 8}]
    )  # fmt: skip
    typed = typed_table("rounds", pd.concat([rounds, central])).to_pandas()
    s = ConditionStats.from_frames(typed, requests, hosts)
    assert (s.verified_rounds, s.fallback_rounds, s.drafted) == (3, 1, 10)
    assert s.draft_lengths == {4: 3, 2: 1}


def test_open_loop_latency_counts_from_arrival(frames):
    rounds, requests, hosts = frames
    requests = requests.assign(t_arrival=[9.5, None])  # d1's request waited 0.5 s
    s = ConditionStats.from_frames(rounds, requests, hosts)
    assert sorted(s.latencies_s["e2e"]) == pytest.approx([0.5, 1.5])
    assert sorted(s.latencies_s["ttft"]) == pytest.approx([0.5, 0.7])


def test_clock_offset_is_bounded_by_half_the_probe_round_trip():
    from testbed.metrics.clocks import measure_offset, offset_from_probe

    probe = offset_from_probe(t0=100.0, t_host=1100.3, t1=100.4)
    assert probe.offset_s == pytest.approx(1000.1) and probe.error_s == pytest.approx(0.2)
    assert probe.to_controller(1100.3) == pytest.approx(100.2)
    # a host 1000 s ahead whose answers take 0.1 s then 0.01 s: the tighter probe is kept
    ticks = iter([0.0, 0.1, 1.0, 1.01])
    answers = iter([1000.05, 1001.005])
    best = measure_offset(lambda: next(answers), probes=2, clock=lambda: next(ticks))
    assert best.offset_s == pytest.approx(1000.0) and best.error_s == pytest.approx(0.005)


def test_capacity_is_the_largest_count_that_keeps_the_rate():
    from testbed.metrics.capacity import capacity_search

    calls = []

    def measure(n):  # a shared server: 100 tok/s split over n devices
        calls.append(n)
        return 100 / n

    result = capacity_search(measure, rate=7.0, low=1, high=64)
    assert result.capacity == 14  # 100/14 = 7.1 >= 7 > 100/15
    assert len(calls) == len(set(calls)) <= 8  # bisection, each count run once
    assert capacity_search(measure, rate=200.0).capacity == 0
    assert capacity_search(measure, rate=1.0, high=64).capacity == 64
    assert capacity_search(lambda n: None, rate=1.0).capacity == 0  # nothing measured


def test_device_verified_minimum(frames):
    s = ConditionStats.from_frames(*frames)
    assert s.device_verified_tok_s_min == pytest.approx(3.0)  # d1: 6 verified / 2 s


def test_target_accuracy_on_the_same_problems(frames):
    rounds, requests, hosts = frames
    requests = requests.assign(
        target_strict_correct=[True, None], target_flexible_correct=[True, None]
    )
    s = ConditionStats.from_frames(rounds, requests, hosts)
    assert s.target_scored == 1 and s.target_strict_accuracy == 1.0
    assert s.target_flexible_accuracy == 1.0


def test_typed_table_writes_numbers_as_text_where_the_schema_says_text(frames):
    requests = frames[1].assign(reference=[26, "12"])
    table = typed_table("requests", requests)
    assert table.column("reference").to_pylist() == ["26", "12"]
    with pytest.raises(ValueError, match="requests.tokens"):
        typed_table("requests", requests.assign(tokens=["many", 3]))


def test_typed_table_fills_gaps_with_the_field_default():
    hosts = pd.DataFrame(
        [
            dict(condition="c", dev="d1", t_start=0.0, t_end=1.0, answered=3),
            dict(condition="c", dev="server", t_start=0.0, t_end=2.0, role="server"),
        ]
    )
    table = typed_table("hosts", hosts)
    assert table.column("answered").to_pylist() == [3, 0]
    assert table.column("role").to_pylist() == ["device", "server"]


def test_steal_is_read_from_the_cpu_line_in_ms(tmp_path):
    import os

    from agents.steal import steal_ms

    stat = tmp_path / "stat"
    stat.write_text("cpu  573372 612 170207 965307 7599 0 3841 315 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
    assert steal_ms(stat) == 315 * 1000.0 / os.sysconf("SC_CLK_TCK")
    for text in ("", "cpu 1 2 3\n", "intr 1 2 3 4 5 6 7 8 9\n", "cpu 1 2 3 4 5 6 7 x 9\n"):
        stat.write_text(text)
        assert steal_ms(stat) is None, text
    assert steal_ms(tmp_path / "missing") is None
    assert steal_ms() is not None  # this kernel's own /proc/stat has the field


def test_steal_sampled_through_a_run_is_told_for_a_window_inside_it(tmp_path):
    import os
    import time

    from agents.steal import StealSampler

    tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3 4 5 6 7 100 0 0\n")
    with StealSampler(every_s=0.01, stat=stat) as sampler:
        time.sleep(0.05)
        mid = time.time()
        stat.write_text("cpu  1 2 3 4 5 6 7 160 0 0\n")  # 60 ticks stolen
        time.sleep(0.05)
    first, last = sampler.samples[0][0], sampler.samples[-1][0]
    assert sampler.between(first, last) == pytest.approx(60 * tick_ms)
    before = max(t for t, _ in sampler.samples if t < mid)
    assert sampler.between(first, before) == 0.0  # read before the change
    assert sampler.between(first - 1.0, last) is None  # not covered by the sampling
    with StealSampler(every_s=0.01, stat=tmp_path / "missing") as blind:
        time.sleep(0.02)
    assert blind.samples == [] and blind.between(0.0, 1.0) is None
