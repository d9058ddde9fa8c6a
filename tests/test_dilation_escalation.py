"""`lab.time_dilation: auto` escalates past its pilot: a whole condition that runs behind at
the dilation its pilot chose runs again at the next one, its try set aside. The condition
runner here is a stand-in whose forwards fall behind below a set dilation (pilots, being
shorter, fall behind below a smaller one); tests/test_time_dilation.py runs the real one."""

from __future__ import annotations

from testbed.config.playbook import Condition, load_playbook
from testbed.results.store import ConditionFolder
from testbed.runner.pilot import DILATIONS, run_dilated


def stand_in(pilot_needs: float, whole_needs: float, ran: list[tuple[str, float]]):
    def run(_ctx, cond: Condition, staged: ConditionFolder) -> dict:
        dilation = float(cond.playbook.lab.time_dilation)
        pilot = "-pilot-" in cond.id
        ran.append(("pilot" if pilot else "whole", dilation))
        (staged.root / "pacing.parquet").write_text(f"x{dilation:g}")
        behind = 0 if dilation >= (pilot_needs if pilot else whole_needs) else 7
        return {"metrics": {"paced_forwards": 100, "behind_forwards": behind,
                            "compute_faithful": behind <= 1}}  # fmt: skip

    return run


def condition(tmp_path) -> Condition:
    book = tmp_path / "auto.yaml"
    book.write_text("name: auto\ntopology: topologies/star.yaml\nlab: {time_dilation: auto}\n")
    return Condition(id="c00", index=0, values={}, playbook=load_playbook(book))


def test_a_whole_condition_behind_at_the_pilots_dilation_runs_again_at_the_next(tmp_path):
    ran: list[tuple[str, float]] = []
    staged = ConditionFolder(tmp_path / "c00")
    staged.root.mkdir()
    said: list[str] = []
    result, tries = run_dilated(stand_in(2, 8, ran), None, condition(tmp_path), staged, said.append)
    assert ran == [("pilot", 1), ("pilot", 2), ("whole", 2), ("whole", 4), ("whole", 8)]
    assert result["metrics"]["compute_faithful"]
    assert [(t["time_dilation"], t.get("whole", False)) for t in tries] == [
        (1, False),
        (2, False),
        (2, True),
        (4, True),
    ]
    # the condition's folder holds the faithful try; each behind one is set aside
    assert (staged.root / "pacing.parquet").read_text() == "x8"
    assert (staged.root / "tries" / "x2" / "pacing.parquet").read_text() == "x2"
    assert (staged.root / "tries" / "x4" / "pacing.parquet").read_text() == "x4"
    assert any("again at 4" in line for line in said)


def test_a_condition_faithful_at_the_pilots_dilation_runs_once(tmp_path):
    ran: list[tuple[str, float]] = []
    staged = ConditionFolder(tmp_path / "c00")
    staged.root.mkdir()
    _, tries = run_dilated(stand_in(2, 2, ran), None, condition(tmp_path), staged, print)
    assert ran == [("pilot", 1), ("pilot", 2), ("whole", 2)]
    assert not any(t.get("whole") for t in tries) and not (staged.root / "tries").exists()


def test_behind_at_every_dilation_stays_marked_unfaithful(tmp_path):
    ran: list[tuple[str, float]] = []
    staged = ConditionFolder(tmp_path / "c00")
    staged.root.mkdir()
    result, tries = run_dilated(stand_in(1, 1e9, ran), None, condition(tmp_path), staged, print)
    assert [d for kind, d in ran if kind == "whole"] == list(DILATIONS)
    assert result["metrics"]["compute_faithful"] is False
    assert len([t for t in tries if t.get("whole")]) == len(DILATIONS)
