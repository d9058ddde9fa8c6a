"""Link-emulation figures: RTT error and loss against the 95 % binomial interval, per loss rate.

    sudo .venv/bin/python bench/bench_link.py [--rtt 85] [--count 500] [--holder auto|c|python]

Brings up a temporary emulated lab (or uses `--lab NAME`, already up), applies RTT `--rtt` with
each loss rate in turn to every device link, probes each link, and prints a table. Goal (design
brief): median |RTT error| <= 0.5 ms and p99 <= 2 ms; measured loss inside the 95 % interval.
Also reports lab up/down time and controller SSH latency at 100 % loss.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.hosts import HostControl  # noqa: E402
from testbed.lab import EmulatedLab, LabSpec  # noqa: E402
from testbed.netem import LinkProfile, ProbeResult, apply, clear, probe_links  # noqa: E402

LOSSES = (0.0, 0.01, 0.1, 0.5, 1.0)


def row(loss: float, backend: str, r: ProbeResult) -> dict[str, object]:
    e = r.rtt_error_ms or {}

    def fig(f) -> str:
        if f.rate is None:
            return "n/a"
        lo, hi = f.interval or (0, 0)
        mark = "ok" if f.within else "OUT"
        return f"{100 * f.rate:5.1f}% [{100 * lo / f.of:.1f},{100 * hi / f.of:.1f}] {mark}"

    return {
        "loss": loss,
        "device": r.device,
        "backend": backend,
        "p50_ms": None if r.rtt_ms is None else round(r.rtt_ms.p50, 3),
        "p99_ms": None if r.rtt_ms is None else round(r.rtt_ms.p99, 3),
        "err_median_ms": None if not e else round(e["median"], 3),
        "err_p99_ms": None if not e else round(e["p99"], 3),
        "loss_up": fig(r.loss_up),
        "loss_down": fig(r.loss_down),
        "loss_rt": fig(r.loss_round_trip),
        "within": r.ok,
        "raw": r.model_dump(mode="json"),
    }


def ssh_latency(lab: EmulatedLab, n: int = 10) -> float:
    """Median seconds of a trivial command over the (already open) Fabric connection."""
    with HostControl(lab.inventory()) as hc:
        hc.run(lab.devices[0].name, "true")
        times = []
        for _ in range(n):
            t = time.monotonic()
            hc.run(lab.devices[0].name, "true")
            times.append(time.monotonic() - t)
    return sorted(times)[len(times) // 2]


def bench(lab: EmulatedLab, args: argparse.Namespace) -> list[dict[str, object]]:
    rows = []
    for loss in LOSSES:
        imp = apply(lab, LinkProfile(rtt_ms=args.rtt, loss=loss), holder=args.holder)
        backend = imp.backend + (f"/{imp.holder}" if imp.holder else "")
        results = probe_links(
            lab, count=args.count, interval_ms=args.interval, parallel=args.parallel
        )
        for res in results.values():
            rows.append(row(loss, backend, res))
        if loss == 1.0:
            rows[-1]["ssh_s_at_full_loss"] = round(ssh_latency(lab), 4)
    clear(lab)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rtt", type=float, default=85.0)
    ap.add_argument("--count", type=int, default=500, help="probe packets per link and rate")
    ap.add_argument("--interval", type=float, default=5.0, help="ms between probe packets")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=1, help="links probed at the same time")
    ap.add_argument("--holder", default="auto", choices=["auto", "c", "python"])
    ap.add_argument("--lab", help="use this running lab instead of a temporary one")
    ap.add_argument("--json", type=Path, help="also write the rows (with raw results) here")
    args = ap.parse_args()

    t0 = time.monotonic()
    if args.lab:
        lab, own = EmulatedLab.find(args.lab), False
    else:
        spec = LabSpec(name="tbench", devices=args.devices, subnet="10.77.211.0/24")
        lab, own = EmulatedLab.up(spec), True
    up_s = time.monotonic() - t0
    try:
        base = ssh_latency(lab)
        rows = bench(lab, args)
    finally:
        if own:
            t1 = time.monotonic()
            lab.down()
            down_s = time.monotonic() - t1
    cols = ["loss", "device", "backend", "p50_ms", "p99_ms", "err_median_ms", "err_p99_ms"]
    cols += ["loss_up", "loss_down", "loss_rt"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    errs = [r for r in rows if r["err_median_ms"] is not None]
    worst_med = max(float(r["err_median_ms"]) for r in errs)  # type: ignore[arg-type]
    worst_p99 = max(float(r["err_p99_ms"]) for r in errs)  # type: ignore[arg-type]
    print(f"\nRTT {args.rtt} ms: worst median error {worst_med:.3f} ms (goal <= 0.5), "
          f"worst p99 error {worst_p99:.3f} ms (goal <= 2)")  # fmt: skip
    print(f"loss inside the 95% binomial interval: {sum(bool(r['within']) for r in rows)}"
          f"/{len(rows)} links x rates")  # fmt: skip
    full = [r["ssh_s_at_full_loss"] for r in rows if "ssh_s_at_full_loss" in r]
    print(f"controller SSH command latency: {1000 * base:.1f} ms unimpaired, "
          f"{1000 * float(full[0]):.1f} ms at 100% loss")  # fmt: skip
    if own:
        print(f"lab with {args.devices} devices: up {up_s:.2f} s, down {down_s:.2f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    ok = worst_med <= 0.5 and worst_p99 <= 2 and all(r["within"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
