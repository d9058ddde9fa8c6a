"""Which draft a condition's devices run, and the acceptance of the pair it stands for.

The stood-for pair's acceptance is the workload catalogue's published figure for
(`models.draft_as`, `models.target_as`, `workload.stands_for`), if it has one. With the tiny
pair, `models.draft_grade` picks the draft of its graded family: a named grade, or `auto`,
the grade whose acceptance measured on the condition's requests (`testbed.models.grades`) is
nearest the stood-for pair's (the default draft where there is nothing to match). Other
drafts (a GGUF file of the playbook) run as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.workloads.arithmetic import Problem
from testbed.config.playbook import Condition
from testbed.core.errors import BadInputError
from testbed.runner.workload import stood_for_model
from testbed.topo.workloads import AcceptanceEntry, load_workloads


@dataclass(frozen=True)
class DraftChoice:
    """The draft file a condition runs, its grade, and the acceptances behind the choice."""

    path: str
    grade: str | None  # the tiny pair's grade, None for a playbook's own draft
    grade_alpha: float | None  # its acceptance measured on the controller before the run
    stood_for: AcceptanceEntry | None

    def columns(self) -> dict[str, Any]:
        """The condition row's columns of the choice."""
        a = self.stood_for
        return {
            "draft_grade": self.grade,
            "draft_grade_alpha": self.grade_alpha,
            "acceptance_as": a.per_token if a else None,
            "acceptance_as_source": a.source if a else None,
        }


def stood_for_acceptance(cond: Condition) -> AcceptanceEntry | None:
    """The published acceptance of the condition's stood-for pair on its workload, if any."""
    pb = cond.playbook
    if not pb.workload.stands_for:
        return None
    return load_workloads().acceptance(
        stood_for_model(pb.models.draft_as), stood_for_model(pb.models.target_as),
        pb.workload.stands_for,
    )  # fmt: skip


def choose_draft(
    cond: Condition, default_path: str, problems: list[Problem], say: Any = print,
    draft_len: int | None = None,
) -> DraftChoice:  # fmt: skip
    """The condition's draft (see the module's docstring), measured at draft_len (default
    `sled.draft_len`)."""
    pb = cond.playbook
    published = stood_for_acceptance(cond)
    if pb.models.draft != "tiny":
        return DraftChoice(default_path, None, None, published)
    from testbed.models.grades import measure_grades, nearest
    from testbed.models.tiny import DEFAULT_DRAFT, PairError, ensure_tiny_pair

    pair = ensure_tiny_pair()
    grade = pb.models.draft_grade
    if grade == "auto" and published is None:
        grade = DEFAULT_DRAFT
    if grade != "auto":
        try:
            path = str(pair.draft_files(grade)[1])
        except PairError as exc:
            raise BadInputError(f"models.draft_grade: {exc}") from None
        return DraftChoice(path, grade, None, published)
    assert published is not None
    k = draft_len or pb.sled.draft_len
    grades = measure_grades(pair, problems, k, pb.workload.max_new_tokens, say)
    best = nearest(grades, published.per_token)
    say(f"{cond.id}: draft {best.grade} (acceptance {best.alpha:.3f} on these requests; the "
        f"stood-for pair's {published.per_token:.3f})")  # fmt: skip
    return DraftChoice(str(pair.draft_files(best.grade)[1]), best.grade, best.alpha, published)
