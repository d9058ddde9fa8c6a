"""Write the two SYNTHETIC link traces in this folder (no measured trace could be shipped).

wifi-synthetic.csv: 120 s at 1 s steps around SLED's 85 ms Wi-Fi RTT; RTT follows an AR(1)
walk (sigma 2 ms), interference episodes add 5-15 ms and 2-10 % loss for 3-8 s, and one 4 s
outage (100 % loss) starts at 60 s. 5g-synthetic.csv: 120 s around a 40 ms RTT (sigma 1 ms) with
a handover every 30 s: 1 s of +25 ms and 5 % loss. Run `python make_synthetic.py` to rebuild
them (seeded, so the files do not change).
"""

from __future__ import annotations

import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def wifi(rng: random.Random) -> list[tuple[float, float, float]]:
    rows, walk, episode_left, extra, loss = [], 0.0, 0, 0.0, 0.0
    for t in range(120):
        walk = 0.8 * walk + rng.gauss(0, 2.0 * 0.6)
        if episode_left == 0 and rng.random() < 0.06:
            episode_left, extra, loss = (
                rng.randint(3, 8),
                rng.uniform(5, 15),
                rng.uniform(0.02, 0.1),
            )
        rtt, lost = 85 + walk + (extra if episode_left else 0.0), loss if episode_left else 0.0
        episode_left = max(0, episode_left - 1)
        if 60 <= t < 64:
            lost = 1.0
        rows.append((float(t), max(rtt, 70.0), lost))
    return rows


def five_g(rng: random.Random) -> list[tuple[float, float, float]]:
    rows = []
    for t in range(120):
        handover = t % 30 == 15
        rows.append(
            (float(t), 40 + rng.gauss(0, 1.0) + (25 if handover else 0), 0.05 if handover else 0.0)
        )
    return rows


def write(name: str, header: str, rows: list[tuple[float, float, float]]) -> None:
    lines = [f"# {line}" for line in header.splitlines()] + ["t_s,rtt_ms,loss"]
    lines += [f"{t:g},{rtt:.2f},{loss:.3f}" for t, rtt, loss in rows]
    (HERE / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write(
        "wifi-synthetic.csv",
        "SYNTHETIC Wi-Fi trace (not measured), made by make_synthetic.py (seed 6):\n"
        "85 ms RTT AR(1) walk, interference episodes (+5-15 ms, 2-10 % loss), outage at 60-64 s.",
        wifi(random.Random(6)),
    )
    write(
        "5g-synthetic.csv",
        "SYNTHETIC 5G trace (not measured), made by make_synthetic.py (seed 5):\n"
        "40 ms RTT (sigma 1 ms), a handover every 30 s: 1 s of +25 ms and 5 % loss.",
        five_g(random.Random(5)),
    )
