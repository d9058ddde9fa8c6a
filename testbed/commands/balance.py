"""BALANCE commands: `testbed bench balance` and `testbed profile`."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from testbed.commands.exits import exit_codes
from testbed.commands.number_lists import numbers

if TYPE_CHECKING:
    from agents.balance.costmodel import CostModel, StepCost


def _load_cost(path: Path) -> CostModel:
    """The cost model at path; a bad file exits with BAD_INPUT and the reason."""
    from testbed.balance.cost_file import read_cost_model

    with exit_codes():
        return read_cost_model(path)


def bench_balance(
    instances: int = typer.Option(1000, help="random instances solved exactly"),
    min_users: int = typer.Option(4, help="users per instance, at least"),
    max_users: int = typer.Option(30, help="users per instance, at most"),
    sizes: str = typer.Option("10,100,1000,2000", help="user counts to time, comma-separated"),
    repeats: int = typer.Option(5, help="timing repeats per user count (median)"),
    seed: int = typer.Option(0, help="seed of the random instances"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the figures here"),
) -> None:
    """The BALANCE scheduler against the exact optimum (HiGHS) and its solve time."""
    from rich.progress import track

    from testbed.balance.bench import POLICIES, ratio_bench, solve_times

    steps = iter(track(range(instances), description="instances"))
    res = ratio_bench(instances, min_users, max_users, seed, progress=lambda: next(steps, None))
    typer.echo(
        f"BALANCE scheduler on {res.instances} random instances of {min_users}-{max_users} "
        f"users (seed {seed}); served users over the exact optimum:"
    )
    typer.echo(f"  {'policy':<16} {'mean':>7} {'worst':>7}")
    for name in POLICIES:
        typer.echo(f"  {name:<16} {res.mean(name):>7.4f} {res.worst(name):>7.4f}")
    typer.echo(
        f"  bound max(OPT-2, min(OPT,1)) violated on {res.bound_violations} instance(s); "
        f"infeasible schedules: {res.infeasible}"
    )
    times = solve_times(numbers(sizes, "--sizes", int, 1), repeats, seed)
    typer.echo("  solve time, median (wall / CPU):")
    for n, t in times.items():
        typer.echo(f"    {n:>6} users  {t.wall_s * 1e3:8.1f} ms / {t.cpu_s * 1e3:8.1f} ms")
    if json_out:
        figures = {
            "instances": res.instances,
            "ratios": {n: {"mean": res.mean(n), "worst": res.worst(n)} for n in POLICIES},
            "bound_violations": res.bound_violations,
            "infeasible": res.infeasible,
            "solve_seconds": {n: {"wall": t.wall_s, "cpu": t.cpu_s} for n, t in times.items()},
        }
        json_out.write_text(json.dumps(figures, indent=2) + "\n")


DEFAULT_PROFILE = Path("results/balance/cost-model.json")


def profile(
    out: Path = typer.Option(DEFAULT_PROFILE, help="where to write the cost model (JSON)"),
    draft_len: int = typer.Option(4, "--draft-len", "-k", help="drafted tokens per SD round"),
    batches: str = typer.Option("1,2,4,8,16", help="batch sizes to time, comma-separated"),
    repeats: int = typer.Option(15, help="timing rounds (each times every point once; median)"),
    threads: int = typer.Option(1, help="CPU threads"),
    device: str = typer.Option("cpu", help="torch device: cpu or cuda"),
    emulation: Path | None = typer.Option(
        None,
        help="an agent's emulation JSON (testbed.runner.emulation): time the engines paced to "
        "the hardware and models it names, in its dilated time",
    ),
) -> None:
    """Measure the BALANCE cost model on this host with the tiny pair and store it as JSON."""
    from agents.balance.measure import measure_cost_model
    from agents.emulation.settings import EmulationError, load_emulation
    from testbed.models.tiny import ensure_tiny_pair

    try:
        emulated = load_emulation(emulation)
    except EmulationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--emulation") from None
    emulated.start()
    pair = ensure_tiny_pair()
    cost = measure_cost_model(
        pair.draft_hf,
        pair.target_hf,
        draft_len=draft_len,
        batches=numbers(batches, "--batches", int, 1),
        repeats=repeats,
        threads=threads,
        device=device,
        wrap=emulated.engine,
    )
    cost.save(out)
    for name, model in (("target", cost.target), ("draft", cost.draft)):
        typer.echo(
            f"{name}: prefill {model.prefill_per_token_s * 1e6:.1f} us/token, KV "
            f"{model.kv_bytes_per_token} B/token, weights {model.weights_bytes / 2**20:.2f} MiB"
        )
    for name, step in (("AD step", cost.ad_step), (f"SD round (g={draft_len})", cost.sd_round)):
        typer.echo(f"{name}: {_fit(step.busy)} back to back, {_fit(step.after_idle)} after idle")
    pts = {kind: dict(points) for kind, points in cost.points.items()}
    for b in pts["sd_round"]:
        forwards = draft_len * pts["draft_decode"][b] + pts["verify"][b]
        typer.echo(
            f"  batch {b:3d}: AD step {_ms(pts['ad_step'][b])} (after idle "
            f"{_ms(pts['ad_step_after_idle'][b])}; its forward {_ms(pts['target_decode'][b])}), "
            f"SD round {_ms(pts['sd_round'][b])} (after idle {_ms(pts['sd_round_after_idle'][b])};"
            f" its forwards {_ms(forwards)})"
        )
    shares = ", ".join(f"{k + 1}: {p:.2f}" for k, p in enumerate(cost.round_tokens))
    typer.echo(
        f"tokens per SD round {cost.tokens_per_round:.2f} (share of rounds yielding {shares}); "
        f"acceptance a={cost.acceptance:.3f}\nwritten to {out}"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _fit(step: StepCost) -> str:
    return f"{step.fixed_s * 1e3:.3f} ms + {step.per_seq_s * 1e3:.3f} ms/seq"


def bench_balance_sim(
    cost_file: Path = typer.Option(DEFAULT_PROFILE, "--cost", help="cost model from `profile`"),
    users: str = typer.Option("100,1000,10000", help="user counts, comma-separated"),
    budgets_mib: str = typer.Option("6.5,8,12,24", help="memory budgets (MiB), comma-separated"),
    rates: str = typer.Option("50", help="arrivals per second, comma-separated"),
    seeds: str = typer.Option("1", help="seeds of the workload, comma-separated"),
    fixed_share: float = typer.Option(
        0.25, help="share of the server each open mode's fixed step cost takes (step rates)"
    ),
) -> None:
    """Simulated users in time of AD-only, SD-only and hybrid over seeds, arrival rates, user
    counts and memory budgets; each row says where the hybrid stands against the better
    single mode, and the last line counts the points."""
    import numpy as np

    from agents.balance.problem import default_service
    from agents.balance.serve import POLICY_MODES
    from testbed.balance.simulator import random_workload, simulate
    from testbed.results.policy_comparison import standing

    seed_list = numbers(seeds, "--seeds", int, 0)
    rate_list = numbers(rates, "--rates", float, 1e-9)
    user_list = numbers(users, "--users", int, 1)
    budget_list = numbers(budgets_mib, "--budgets-mib", float, 1e-9)
    cost = _load_cost(cost_file)
    service = default_service(cost, fixed_share=fixed_share)
    typer.echo(
        f"{'seed':>4} {'rate':>6} {'users':>6} {'MiB':>6}  "
        + "  ".join(f"{p + ' in time/late':>20}" for p in POLICY_MODES)
        + f"  {'peak MiB':>8}  hybrid"
    )
    stand = {"above": 0, "equal": 0, "below": 0}
    for seed, rate, n in itertools.product(seed_list, rate_list, user_list):
        work = random_workload(np.random.default_rng(seed), n, rate)
        for mib in budget_list:
            res = {p: simulate(cost, work, mib * 2**20, service, p) for p in POLICY_MODES}
            cells = "  ".join(f"{r.served_in_time:>14}/{r.late:<5}" for r in res.values())
            peak = max(r.peak_memory_bytes for r in res.values()) / 2**20
            margin = res["hybrid"].served_in_time - max(
                res[p].served_in_time for p in ("ad-only", "sd-only")
            )
            stand[standing(margin)] += 1
            typer.echo(
                f"{seed:>4} {rate:>6g} {n:>6} {mib:>6.1f}  {cells}  {peak:>8.2f}  "
                f"{standing(margin)} ({margin:+d})"
            )
    typer.echo(
        "hybrid against the better single mode: "
        + ", ".join(f"{k} at {v}" for k, v in stand.items())
        + f" of {sum(stand.values())} points"
    )


def bench_balance_check(
    cost_file: Path = typer.Option(DEFAULT_PROFILE, "--cost", help="cost model from `profile`"),
    users: int = typer.Option(40, help="users (arithmetic problems) in the workload"),
    rate: float = typer.Option(10.0, help="arrivals per second"),
    budget_mib: float = typer.Option(8.0, help="memory budget (MiB)"),
    threads: int = typer.Option(1, help="CPU threads"),
    seed: int = typer.Option(0, help="seed of the workload"),
) -> None:
    """The simulator against the real engine on the tiny pair; KV accounting against RSS."""
    import numpy as np

    from agents.balance.problem import default_service
    from agents.balance.serve import POLICY_MODES
    from testbed.balance.validate import check_memory, compare_with_engine
    from testbed.models.tiny import ensure_tiny_pair

    cost = _load_cost(cost_file)
    pair = ensure_tiny_pair()
    typer.echo(f"{users} users at {rate}/s, {budget_mib} MiB; measured (engine) vs simulated")
    for policy in POLICY_MODES:
        c = compare_with_engine(
            cost,
            pair.draft_hf,
            pair.target_hf,
            users,
            rate,
            budget_mib * 2**20,
            default_service(cost),
            policy,
            seed,
            threads,
        )
        typer.echo(
            f"  {policy:<8} in time {c.measured.served_in_time:>4}/{c.predicted.served_in_time:<4}"
            f" late {c.measured.late:>3} / {c.predicted.late:<3} completion-time error: mean |e| "
            f"{c.mean_abs_error:.1%}, median {float(np.median(c.latency_error)):+.1%}"
        )
    mem = check_memory(cost, pair.draft_hf, pair.target_hf)
    typer.echo(
        f"  memory: {mem.users} SD users x {mem.tokens} tokens, KV by the cost model "
        f"{mem.predicted_bytes / 2**20:.1f} MiB, measured growth {mem.measured_bytes / 2**20:.1f}"
        f" MiB ({mem.ratio:.2f}x)"
    )
