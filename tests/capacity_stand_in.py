"""A stand-in for the runs `testbed capacity` makes (tests/test_capacity_e2e.py makes real
ones): a shared server of 100 verified tok/s, whose forwards fall behind the hardware they
stand for above FAITHFUL_UP_TO["n"] devices, each probe a run folder with one done condition."""

from __future__ import annotations

from testbed.config.playbook import load_playbook
from testbed.results.store import RunStore
from testbed.runner.run import RunOutcome

FAITHFUL_UP_TO = {"n": 10}


def probe_run(path, out, say) -> RunOutcome:
    """The probe's run: its playbook's device count shares the server's 100 tok/s."""
    pb = load_playbook(path)
    n = pb.lab.devices
    ok = n <= FAITHFUL_UP_TO["n"]
    store = RunStore(out / pb.name)
    store.create({"run_id": pb.name})
    metrics = {"device_verified_tok_s_min": 100 / n, "compute_faithful": ok,
               "behind_share": 0.0 if ok else 0.05}  # fmt: skip
    store.commit("c00", store.staging("c00"), {"condition": "c00", "index": 0, "status": "done",
                 "link": {"time_dilation": 2.0}, "metrics": metrics})  # fmt: skip
    return RunOutcome(store, 1, 0, 0)
