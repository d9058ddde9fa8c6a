"""Apply and clear link profiles on a lab's device <-> server links, with the right backend.

Backends see a lab only as a `LinkSite` (testbed.labs.interface): the forwarding point where
links are impaired and, per host, its address and the interface facing it there; any lab kind
(namespaces, mininet, inventory with a middlebox) provides one.

A lab with a backup path (testbed.labs.backup) has a second link per device: `apply_each(lab,
primary, backup=...)` impairs both paths in one go, with one backend state (one rule set and one
holder per bridge namespace), so neither path's impairment wipes the other's.

The whole impairment of a lab (backend, per-device profiles of both paths, holder) is kept in
`<lab state dir>/run/impairment.json`, so another process (`testbed lab clear`) can undo it.
Every apply is verified on the system; a link whose impairment is not in place raises
ImpairmentError instead of running unimpaired.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from testbed.core.errors import ImpairmentError
from testbed.core.files import atomic_write_text
from testbed.labs.backup import load_plan
from testbed.labs.interface import LinkSite
from testbed.labs.setup import LabHost
from testbed.labs.system import SystemRunner
from testbed.links import hostside
from testbed.links.detect import BackendName, choose_backend
from testbed.links.hostside import HostSideBackend
from testbed.links.nfqueue import NfqueueBackend
from testbed.links.nfqueue import link_changes as forwarding_changes
from testbed.links.tcnetem import TcNetemBackend
from testbed.topo.profile import LOSS_SEMANTICS, LinkProfile

STATE_FILE = "impairment.json"


class Impairment(BaseModel):
    """What is applied to a lab now: which backend ran, why, and each device's profile on its
    primary link (`profiles`) and on its backup link (`backup`)."""

    lab: str
    backend: BackendName
    reason: str
    holder: str | None = None  # "c" (the compiled packet holder) for the nfqueue backend
    profiles: dict[str, LinkProfile] = {}
    backup: dict[str, LinkProfile] = {}
    backend_state: dict[str, Any] = {}
    applied_at: float = 0.0
    loss_semantics: str = LOSS_SEMANTICS


class Backend(Protocol):
    name: str

    def apply(
        self,
        lab: LinkSite,
        profiles: dict[str, LinkProfile],
        backup: dict[str, LinkProfile] | None = None,
    ) -> dict[str, Any]: ...

    def clear(self, lab: LinkSite, state: dict[str, Any]) -> None: ...

    def verify(
        self,
        lab: LinkSite,
        profiles: dict[str, LinkProfile],
        state: dict[str, Any],
        backup: dict[str, LinkProfile] | None = None,
    ) -> None: ...

    def verify_clear(self, lab: LinkSite) -> None: ...


def make_backend(name: BackendName, runner: SystemRunner, lab: LinkSite) -> Backend:
    """Backend `name` at `lab`'s forwarding point, or on its hosts where it has none."""
    if lab.impaired_on_hosts:
        return HostSideBackend(name, runner)
    if name == "netem":
        return TcNetemBackend(runner)
    return NfqueueBackend(runner)


def link_changes(lab: LinkSite) -> list[dict[str, object]]:
    """Every profile change the packet holder(s) of `lab` applied, in stamp order. `at` is on
    the clock of the machine whose holder applied it: a change with `host` was applied on that
    lab host (a lab impaired on its hosts), one without at the lab's forwarding point (where
    `lab.runner` runs)."""
    return hostside.link_changes(lab) if lab.impaired_on_hosts else forwarding_changes(lab)


def _state_path(lab: LinkSite) -> Path:
    return lab.runtime_dir / STATE_FILE


def current(lab: LinkSite) -> Impairment | None:
    """The impairment applied to `lab`, or None."""
    path = _state_path(lab)
    if not path.exists():
        return None
    try:
        return Impairment.model_validate_json(path.read_text())
    except (OSError, ValidationError) as exc:
        raise ImpairmentError(f"{path}: unreadable impairment state: {exc}") from exc


def _names(lab: LinkSite, devices: Iterable[str | LabHost] | None) -> list[str]:
    if devices is None:
        return [d.name for d in lab.devices]
    names = [d.name if isinstance(d, LabHost) else d for d in devices]
    known = {d.name for d in lab.devices}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ImpairmentError(
            f"lab {lab.name} has no device(s) {unknown} (devices: {', '.join(sorted(known))})"
        )
    return names


def apply(
    lab: LinkSite,
    profile: LinkProfile,
    devices: Iterable[str | LabHost] | None = None,
    backend: str = "auto",
    runner: SystemRunner | None = None,
) -> Impairment:
    """Impair the links of `devices` (default: all) with `profile`; returns what is applied.

    Devices not named keep their current profile, and every backup link keeps its own.
    `backend` is auto | netem | nfqueue (auto keeps the backend already in use, else netem where
    the kernel has it, else nfqueue; nfqueue wherever a link has a schedule or a trace).
    """
    profiles = dict.fromkeys(_names(lab, devices), profile)
    return apply_each(lab, profiles, backend, runner)


def apply_each(
    lab: LinkSite,
    profiles: dict[str, LinkProfile],
    backend: str = "auto",
    runner: SystemRunner | None = None,
    *,
    backup: dict[str, LinkProfile] | None = None,
) -> Impairment:
    """Impair each named device's primary link with its own profile (e.g. a topology's
    primary links) and each device in `backup` its backup link (a lab with a backup path);
    links not named keep their current profile. See `apply` for `backend`."""
    runner = runner or lab.runner
    _names(lab, profiles)
    if backup:
        _names(lab, backup)
        if load_plan(lab) is None:
            raise ImpairmentError(
                f"lab {lab.name} has no backup path, so its backup links cannot be impaired"
            )
    was = current(lab)
    merged = dict(was.profiles) if was else {}
    merged.update(profiles)
    merged_backup = dict(was.backup) if was else {}
    merged_backup.update(backup or {})
    varies = any(p.varies for p in (*merged.values(), *merged_backup.values()))
    if was is not None and backend == "auto" and not (varies and was.backend == "netem"):
        name, reason = was.backend, was.reason
    else:
        probe = (lambda: hostside.hosts_have_netem(lab)) if lab.impaired_on_hosts else None
        name, reason = choose_backend(backend, runner, probe, varies=varies)
    return _set_profiles(lab, was, (merged, merged_backup), name, reason, runner)


def clear(
    lab: LinkSite,
    devices: Iterable[str | LabHost] | None = None,
    runner: SystemRunner | None = None,
) -> Impairment | None:
    """Remove the impairment of `devices` (default: all; both paths, checked gone); returns
    what remains."""
    runner = runner or lab.runner
    was = current(lab)
    if was is None:
        return None
    if devices is not None:
        drop = set(_names(lab, devices))
        keep = {k: v for k, v in was.profiles.items() if k not in drop}
        keep_backup = {k: v for k, v in was.backup.items() if k not in drop}
        if keep or keep_backup:
            links = (keep, keep_backup)
            return _set_profiles(lab, was, links, was.backend, was.reason, runner)
    impl = make_backend(was.backend, runner, lab)
    impl.clear(lab, was.backend_state)
    impl.verify_clear(lab)
    if not runner.dry_run:
        _state_path(lab).unlink(missing_ok=True)
    return None


def verify(lab: LinkSite, runner: SystemRunner | None = None) -> Impairment | None:
    """Check that the current impairment (both paths) is still in place (e.g. between
    conditions).

    Raises ImpairmentError if a rule, queue or holder has gone; returns what is applied.
    """
    runner = runner or lab.runner
    imp = current(lab)
    if imp is not None:
        impl = make_backend(imp.backend, runner, lab)
        impl.verify(lab, imp.profiles, imp.backend_state, imp.backup)
    return imp


def _set_profiles(
    lab: LinkSite,
    was: Impairment | None,
    links: tuple[dict[str, LinkProfile], dict[str, LinkProfile]],
    name: BackendName,
    reason: str,
    runner: SystemRunner,
) -> Impairment:
    """Replace the lab's whole impairment by `links` (primary and backup profiles) with
    backend `name`, then verify it."""
    profiles, backup = ({k: v for k, v in d.items() if not v.is_null} for d in links)
    if was is not None and was.backend != name:
        make_backend(was.backend, runner, lab).clear(lab, was.backend_state)
    impl = make_backend(name, runner, lab)
    try:
        state = impl.apply(lab, profiles, backup)
        impl.verify(lab, profiles, state, backup)
    except BaseException:
        _clear_quietly(impl, lab)
        if not runner.dry_run:
            _state_path(lab).unlink(missing_ok=True)
        raise
    imp = Impairment(
        lab=lab.name,
        backend=name,
        reason=reason,
        holder=state.get("holder"),
        profiles=profiles,
        backup=backup,
        backend_state=state,
        applied_at=time.time(),
    )
    if not runner.dry_run:
        atomic_write_text(_state_path(lab), imp.model_dump_json(indent=2))
    return imp


def _clear_quietly(impl: Backend, lab: LinkSite) -> None:
    with contextlib.suppress(Exception):  # the original error is the one to report
        impl.clear(lab, {"shaped_ports": [h.port for h in lab.hosts]})
