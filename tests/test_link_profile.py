"""The one link-profile schema: Gilbert-Elliott loss, jitter distributions, schedules, traces,
and how the netem and holder backends render it (no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.core.errors import BadInputError, ImpairmentError
from testbed.labs import EmulatedLab, LabSetup, SystemRunner
from testbed.links.nfqueue import holder_config
from testbed.links.tcnetem import TcNetemBackend, netem_args
from testbed.topo.profile import GilbertElliott, LinkProfile, ScheduleStep
from testbed.topo.schedule import timeline
from testbed.topo.trace import load_trace

TRACES = Path(__file__).resolve().parent.parent / "topologies" / "traces"


def test_gilbert_elliott_uses_netem_names_and_its_stationary_figures() -> None:
    prof = LinkProfile.build("t.yaml", loss_up={"p": 0.01, "r": 0.3, "1-h": 0.8, "1-k": 0.001})
    ge = prof.loss_model("up")
    assert isinstance(ge, GilbertElliott) and ge.one_minus_h == 0.8
    bad = 0.01 / 0.31
    assert ge.bad_share == pytest.approx(bad)
    assert prof.up_loss == pytest.approx(bad * 0.8 + (1 - bad) * 0.001)
    assert prof.down_loss == 0.0 and GilbertElliott(p=0.1, r=0.25).mean_burst == 4.0
    assert ge.mean_burst == pytest.approx(1 / (1 - (0.7 * 0.8 + 0.3 * 0.001)))
    # random loss is the one-state chain, so the holder has one loss path
    assert LinkProfile(loss=0.2).gilbert_elliott("down") == GilbertElliott(
        p=0, r=1, one_minus_k=0.2
    )
    with pytest.raises(BadInputError, match=r"loss_down\.gemodel: .*r must be > 0"):
        LinkProfile.build("t.yaml", loss_down={"p": 0.1, "r": 0})


def test_profile_round_trips_through_json_as_records_store_it() -> None:
    prof = LinkProfile(
        rtt_ms=85,
        jitter_ms=2,
        jitter_dist="normal",
        loss_up=GilbertElliott(p=0.02, r=0.5),
        schedule=(ScheduleStep(at_s=5, loss=1.0),),
    )
    assert LinkProfile.model_validate_json(prof.model_dump_json()) == prof


def test_schedule_must_increase_and_excludes_a_trace() -> None:
    with pytest.raises(BadInputError, match="at_s must increase"):
        LinkProfile.build("t.yaml", schedule=[{"at_s": 2}, {"at_s": 1}])
    with pytest.raises(BadInputError, match="either schedule or trace"):
        LinkProfile.build("t.yaml", schedule=[{"at_s": 1}], trace="x.csv")


def test_timeline_steps_replace_only_the_fields_given() -> None:
    prof = LinkProfile(
        rtt_ms=85,
        loss_up=0.05,
        schedule=(ScheduleStep(at_s=10, rtt_ms=120), ScheduleStep(at_s=20, loss=1.0)),
    )
    phases = timeline(prof)
    assert [p.at_s for p in phases] == [0, 10, 20]
    assert [(p.profile.rtt_ms, p.profile.up_loss, p.profile.down_loss) for p in phases] == [
        (85, 0.05, 0.0),
        (120, 0.05, 0.0),
        (120, 1.0, 1.0),  # a new `loss` sets both directions
    ]
    assert not any(p.profile.varies for p in phases)


def test_shipped_traces_load_and_say_they_are_synthetic() -> None:
    for name in ("wifi-synthetic.csv", "5g-synthetic.csv"):
        text = (TRACES / name).read_text()
        assert "SYNTHETIC" in text.splitlines()[0]
        steps = load_trace(Path("topologies/traces") / name)  # relative to the repository
        assert len(steps) == 120 and steps[0].at_s == 0 and steps[-1].at_s == 119
    wifi = timeline(LinkProfile(rtt_ms=85, trace=Path("topologies/traces/wifi-synthetic.csv")))
    assert [p.profile.up_loss for p in wifi[60:64]] == [1.0] * 4  # the outage it documents


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "# comment\nt_s,rtt_ms,loss\n0,85,0\n1,85,1.5\n",
            r"row 4, column 3 \(loss\): .*less than or equal to 1",
        ),
        (
            "t_s,rtt_ms,loss\n0,85,0\n1,eighty,0\n",
            r"row 3, column 2 \(rtt_ms\): 'eighty' is not a number",
        ),
        (
            "t_s,rtt_ms,loss\n0,85,0\n1,85,7\n",
            r"row 3, column 3 \(loss\): .*less than or equal to 1",
        ),
        (
            "t_s,loss,jitter_ms\n0,0,-1\n",
            r"row 2, column 3 \(jitter_ms\): .*greater than or equal to 0",
        ),
        ("t_s,rtt_ms\n0,85\n\n# gap\n0,90\n", r"row 5, column 1 \(t_s\): t_s must increase"),
        ("t_s,rtt_ms\n0,85\n1,85,3\n", r"row 3: 3 cells, expected 2"),
        ("t_s,rtt_ms\n,85\n", r"row 2, column 1 \(t_s\): empty"),
        ("t_s,rtt_ms\n0,nan\n", r"row 2, column 2 \(rtt_ms\): 'nan' is not a number"),
        ("t_s,delay\n0,85\n", r"row 1: trace columns \['delay'\]"),
        ("t_s,rtt_ms\n", r"row 1: trace has a header and no rows"),
    ],
)
def test_bad_trace_names_file_row_and_column(tmp_path: Path, text: str, where: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    with pytest.raises(BadInputError, match=rf"bad\.csv {where}"):
        load_trace(bad)


def test_netem_renders_gemodel_distribution_and_limit() -> None:
    prof = LinkProfile(
        rtt_ms=85,
        jitter_ms=3,
        jitter_dist="pareto",
        loss_up=GilbertElliott(p=0.01, r=0.25, one_minus_h=0.9),
        loss_down=0.02,
        queue_limit=500,
    )
    assert " ".join(netem_args(prof, "up")) == (
        "netem limit 500 delay 42.5ms 3ms distribution pareto rate 10gbit "
        "loss gemodel 1% 25% 90% 0%"
    )
    assert " ".join(netem_args(prof, "down")) == (
        "netem limit 500 delay 42.5ms 3ms distribution pareto rate 10gbit loss random 2%"
    )
    # netem keeps order only given a rate; `order: reorder` is netem as it is
    passing = prof.model_copy(update={"order": "reorder"})
    assert " ".join(netem_args(passing, "down")) == (
        "netem limit 500 delay 42.5ms 3ms distribution pareto loss random 2%"
    )


def _dry_lab(tmp_path: Path) -> EmulatedLab:
    setup = LabSetup(name="bprof", devices=2, subnet="10.79.210.0/24", state_dir=tmp_path)
    return EmulatedLab.up(setup, runner=SystemRunner(dry_run=True, echo=lambda _l: None))


def test_netem_refuses_a_schedule_rather_than_ignoring_it(tmp_path: Path) -> None:
    lab = _dry_lab(tmp_path)
    prof = LinkProfile(rtt_ms=85, schedule=(ScheduleStep(at_s=1, loss=1.0),))
    with pytest.raises(ImpairmentError, match="cannot run a schedule"):
        TcNetemBackend(SystemRunner(dry_run=True)).apply(lab, {"dev1": prof})


def test_holder_config_lists_every_phase_per_direction(tmp_path: Path) -> None:
    lab = _dry_lab(tmp_path)
    prof = LinkProfile(
        rtt_ms=85,
        jitter_ms=1,
        jitter_dist="normal",
        loss_up=GilbertElliott(p=0.05, r=0.5),
        seed=4,
        schedule=(ScheduleStep(at_s=2.5, loss=1.0),),
    )
    setup = holder_config(7, list(enumerate(lab.devices, start=1)), {"dev2": prof})
    assert setup.splitlines() == [
        "generation 7",
        "queue 104 100000 5 dev2 up keep",
        "phase 104 0 42500 1000 normal 0.05 0.5 1 0",
        "phase 104 2500000 42500 1000 normal 0 1 1 1",
        "queue 105 100000 5 dev2 down keep",
        "phase 105 0 42500 1000 normal 0 1 1 0",
        "phase 105 2500000 42500 1000 normal 0 1 1 1",
    ]
