"""Remove a lab's (or every lab's) namespaces, links and processes, found on the system itself.

Works with no state file (like `mn -c`): everything a lab makes is named `tb-<lab>-...`.
"""

from __future__ import annotations

from testbed.core.errors import LabError
from testbed.labs import naming, owner
from testbed.labs.discover import kill_pids, list_netns, netns_pids, root_links, tagged_processes
from testbed.labs.setup import default_state_dir
from testbed.labs.state import STATE_FILE
from testbed.labs.system import SystemRunner


def _prefix(lab: str | None) -> str:
    return naming.netns_prefix(lab) if lab else naming.PREFIX


def leftovers(lab: str | None = None, runner: SystemRunner | None = None) -> list[str]:
    """What of lab `lab` (or of any lab) exists on the system now, one line per object."""
    runner = runner or SystemRunner()
    prefix = _prefix(lab)
    found = [f"netns {n}" for n in list_netns(runner, prefix)]
    found += [f"link {n}" for n in root_links(runner, prefix)]
    found += [f"process {pid} ({cmd})" for pid, cmd in tagged_processes(prefix)]
    return found


def remove_lab_objects(lab: str | None, runner: SystemRunner) -> list[str]:
    """Kill the lab's processes, delete its root links and namespaces; returns what it removed."""
    prefix = _prefix(lab)
    removed: list[str] = []
    namespaces = list_netns(runner, prefix)
    procs = dict(tagged_processes(prefix))
    for ns in namespaces:
        for pid in netns_pids(runner, ns):
            procs.setdefault(pid, f"in netns {ns}")
    for pid in kill_pids(runner, sorted(procs)):
        removed.append(f"process {pid} ({procs[pid]})")
    for link in root_links(runner, prefix):
        runner.run(["ip", "link", "del", link], check=False)
        removed.append(f"link {link}")
    for ns in namespaces:
        runner.run(["ip", "netns", "del", ns], check=False)
        removed.append(f"netns {ns}")
    return removed


def verify_gone(lab: str | None, runner: SystemRunner) -> None:
    """Raise LabError listing whatever of the lab is still on the system."""
    if runner.dry_run:
        return
    left = leftovers(lab, runner)
    if left:
        raise LabError("could not remove: " + "; ".join(left))


def clean_all(
    lab: str | None = None, runner: SystemRunner | None = None, remove_state: bool = True
) -> list[str]:
    """Remove every leftover of lab `lab` (every lab if None); returns what was removed.

    Also deletes the default state folders (`<cache>/labs/<name>`) of the labs it cleaned.
    """
    runner = runner or SystemRunner()
    names = {lab} if lab else set()
    if not lab:
        names |= {naming.lab_of_netns(n) for n in list_netns(runner)} - {None}  # type: ignore[arg-type]
        names |= {naming.lab_of_netns(n) for n in root_links(runner)} - {None}  # type: ignore[arg-type]
    removed = remove_lab_objects(lab, runner)
    for name in sorted(names):
        if not runner.dry_run:
            owner.release(name)
    if remove_state:
        labs_dir = default_state_dir("x").parent
        if not lab and labs_dir.is_dir():
            names |= {p.name for p in labs_dir.iterdir() if (p / STATE_FILE).exists()}
        for name in sorted(names):
            d = default_state_dir(name)
            if (d / STATE_FILE).exists():
                runner.remove_tree(d)
                removed.append(f"state {d}")
    verify_gone(lab, runner)
    return removed
