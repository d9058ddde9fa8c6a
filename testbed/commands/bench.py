"""`testbed bench ...`: benchmarks that print measured figures and ratios."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from testbed.commands.exits import exit_codes
from testbed.commands.number_lists import numbers


def sd(
    prompts: int = typer.Option(30, help="held-out problems to generate for"),
    draft_len: int = typer.Option(4, "--draft-len", "-k", help="drafted tokens per round (g)"),
    max_new: int = typer.Option(48, help="new tokens per answer at most"),
    draft_engine: str = typer.Option("llama", help="engine of the draft: llama or torch"),
    threads: int = typer.Option(1, help="CPU threads per engine"),
    device: str = typer.Option("cpu", help="torch device of the target (and a torch draft)"),
    seed: int = typer.Option(3, help="seed of the held-out problems"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the figures here"),
) -> None:
    """AD vs SD on the tiny pair: acceptance, accepted length, speedup vs the analytic bound."""
    from agents.engines.factory import load_engine
    from agents.spec.speedup import run_sd_bench
    from agents.workloads.arithmetic import heldout_problems, prompt
    from testbed.models.tiny import ensure_tiny_pair

    pair = ensure_tiny_pair()
    draft_path = pair.draft_gguf if draft_engine == "llama" else pair.draft_hf
    draft = load_engine(draft_path, kind=draft_engine, threads=threads, device=device)
    target = load_engine(pair.target_hf, kind="torch", threads=threads, device=device)
    ids = [target.tokenize(prompt(p)) for p in heldout_problems(prompts, seed=seed)]
    res = run_sd_bench(draft, target, ids, draft_len, max_new)
    figures = res.as_dict()
    typer.echo(
        f"SD benchmark: draft {draft.describe()} / target {target.describe()}, "
        f"{prompts} prompts, g={draft_len}, {threads} thread(s)\n"
        f"  AD: {res.ad_tokens} tokens in {res.ad_seconds:.2f} s "
        f"({res.ad_tokens / res.ad_seconds:.1f} tok/s)\n"
        f"  SD: {res.sd_tokens} tokens in {res.sd_seconds:.2f} s "
        f"({res.sd_tokens / res.sd_seconds:.1f} tok/s), {res.rounds} rounds\n"
        f"  acceptance rate (accepted/drafted)        {res.acceptance_rate:.3f}\n"
        f"  per-position acceptance a (MLE)           {res.alpha:.3f}\n"
        f"  mean accepted length (with bonus)         {res.mean_accepted_length:.2f}\n"
        f"  cost ratio c (draft step / AD step)       {res.cost_ratio:.3f}\n"
        f"  verify ratio v (verify g+1 / AD step)     {res.verify_ratio:.2f}\n"
        f"  measured speedup                          {res.speedup:.2f}x\n"
        f"  bound (1-a^(g+1))/((1-a)(gc+1))           {res.bound:.2f}x "
        f"-> measured/bound {res.speedup / res.bound:.1%} (goal >= 90%)\n"
        f"  cost-aware bound (1-a^(g+1))/((1-a)(gc+v)) {res.cost_aware_bound:.2f}x "
        f"-> measured/bound {res.speedup / res.cost_aware_bound:.1%}\n"
        f"  SD output identical to AD                 {res.identical_outputs}/{res.prompts}"
    )
    if json_out:
        json_out.write_text(json.dumps(figures, indent=2) + "\n")


def verify(
    model: Path | None = typer.Option(None, help="target HF folder (default: the tiny target)"),
    device: str = typer.Option("cpu", help="torch device: cpu or cuda"),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16"),
    batches: str = typer.Option("1,2,4,8,16", help="batch sizes, comma-separated"),
    draft_len: int = typer.Option(4, "--draft-len", "-k", help="drafts per request (g)"),
    threads: int = typer.Option(1, help="CPU threads"),
) -> None:
    """Batched verification on the server engine: time per batch and gain over one-by-one."""
    from agents.engines.torch_hf import TorchEngine
    from agents.workloads.arithmetic import heldout_problems, prompt
    from testbed.bench.verify import time_batches
    from testbed.models.tiny import ensure_tiny_pair

    path = model or ensure_tiny_pair().target_hf
    engine = TorchEngine(path, device=device, dtype=dtype, threads=threads)
    prompts = [engine.tokenize(prompt(p)) for p in heldout_problems(16, seed=3)]
    sizes = numbers(batches, "--batches", int, 1)
    typer.echo(f"batched verification: {engine.describe()} on {device} ({dtype}), g={draft_len}")
    typer.echo(f"{'batch':>6} {'ms/batch':>9} {'ms/single':>10} {'verified tok/s':>15} {'gain':>6}")
    for pt in time_batches(engine, prompts, sizes, draft_len):
        tok_s = pt.batch * (draft_len + 1) / (pt.batch_ms / 1000)
        typer.echo(
            f"{pt.batch:>6} {pt.batch_ms:>9.3f} {pt.single_ms:>10.3f} {tok_s:>15.0f} "
            f"{pt.batching_gain:>5.2f}x"
        )


def gpu(
    pair: Path | None = typer.Argument(None, help="tiny pair folder (default: the cached one)"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the figures here"),
) -> None:
    """The server side on a CUDA machine (GPU_CHECK_DEVICE=cpu to try it here): batched
    verification, SD vs AD, the SLED server over loopback."""
    from testbed.bench.gpu import main
    from testbed.models.tiny import ensure_tiny_pair

    main(pair or ensure_tiny_pair().root, json_out)


def hardware(
    json_out: Path | None = typer.Option(None, "--json", help="also write the figures here"),
    fit: bool = typer.Option(False, "--fit", help="refit every entry; print values and YAML"),
    write: bool = typer.Option(False, "--write", help="with --fit: rewrite the catalogue"),
    catalogue: Path | None = typer.Option(
        None, "--catalogue", help="catalogue file (default: topologies/hardware.yaml)"
    ),
    live: bool = typer.Option(True, "--live/--no-live", help="measure this CPU's points live"),
    loo: bool = typer.Option(
        True, "--loo/--no-loo", help="leave-one-out errors (refits each entry once per point)"
    ),
) -> None:
    """The cost model against every calibration point of the hardware catalogue: published
    vs predicted step times, error, a plain roofline; this CPU measured live; the pacing's
    own error on this machine."""
    from rich.console import Console

    from testbed.bench.hardware import run
    from testbed.bench.pacing import run_pacing
    from testbed.core.errors import ExitCode
    from testbed.topo.catalogue import DEFAULT_PATH

    if write and not fit:
        typer.echo("--write: only with --fit (it writes the refitted values)", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT)
    with exit_codes(), Console(stderr=True).status("bench hardware") as status:
        run(
            catalogue or DEFAULT_PATH,
            echo=typer.echo,
            progress=lambda msg: status.update(msg),
            refit=fit,
            write=write,
            live=live,
            json_out=json_out,
            loo=loo,
        )
        if not fit:
            pacing = run_pacing(typer.echo, lambda msg: status.update(msg))
            if json_out:
                figures = json.loads(json_out.read_text())
                json_out.write_text(json.dumps({**figures, "pacing": pacing}, indent=1))


def lab_paths(
    draft_as: str = typer.Option(
        "llama-3.2-1b@q4_0", help="the catalogue model the tiny draft stands for"
    ),
    tokens: int = typer.Option(64, help="drafted tokens per round"),
    cuts: int = typer.Option(5, help="times the primary link is cut"),
) -> None:
    """Host-class drafting rates (Pi 5 vs Jetson, paced) and backup-path switch-over times."""
    from testbed.bench.lab_paths import drafting, switchover

    drafting(draft_as, tokens)
    switchover(cuts)


def sled_loss(
    policies: str = typer.Option("fixed,adaptive,redundant", help="loss policies, comma-separated"),
    losses: str = typer.Option("0,0.05,0.1", help="per-direction loss levels"),
    devices: int = typer.Option(2, help="device agents"),
    problems: int = typer.Option(6, help="problems per device"),
    rtt_ms: float = typer.Option(85.0, help="emulated round-trip time"),
    seed: int = typer.Option(1, help="seed of problems and losses"),
) -> None:
    """SLED verified-token throughput under loss, per loss policy, as a share of 0 % loss."""
    from agents.engines.base import Engine
    from agents.engines.llama_cpp import LlamaCppEngine
    from agents.engines.torch_hf import TorchEngine
    from testbed.bench.sled_loss import run_condition
    from testbed.models.tiny import ensure_tiny_pair

    pair = ensure_tiny_pair()
    target = TorchEngine(pair.target_hf, threads=1)
    drafts: list[Engine] = [LlamaCppEngine(pair.draft_gguf, n_threads=1) for _ in range(devices)]
    levels = [float(x) for x in losses.split(",")]
    typer.echo(f"SLED under loss: {devices} devices x {problems} problems, RTT {rtt_ms} ms "
               "(loopback relay), verified tokens/s")  # fmt: skip
    for policy in policies.split(","):
        base = None
        for loss in levels:
            fig = run_condition(target, drafts, policy, loss, problems, rtt_ms, seed)
            base = base or fig.verified_tok_s
            typer.echo(
                f"  {policy:9s} loss {loss:4.0%}: {fig.verified_tok_s:6.1f} tok/s verified "
                f"({fig.verified_tok_s / base:6.1%} of 0 %), fallback {fig.fallback_tokens}, "
                f"dropped {fig.datagrams_dropped}/{fig.datagrams} datagrams"
            )


def drafting(
    prompts: int = typer.Option(10, help="held-out problems"),
    tokens: int = typer.Option(8, help="drafted tokens per round"),
    seconds: float = typer.Option(2.0, help="timing per rate measurement"),
    max_new: int = typer.Option(48, help="tokens per answer in the acceptance run"),
) -> None:
    """Quantized drafts (f32, f16, q8_0, q4_0): acceptance and drafting rate vs raw llama.cpp."""
    import tempfile

    from agents.engines.torch_hf import TorchEngine
    from agents.workloads.arithmetic import heldout_problems, prompt
    from testbed.bench.drafting import (
        VARIANTS,
        DraftFigure,
        acceptance,
        agent_rate,
        raw_rate,
        variant_files,
    )
    from testbed.models.tiny import ensure_tiny_pair

    pair = ensure_tiny_pair()
    target = TorchEngine(pair.target_hf, threads=1)
    ids = [target.tokenize(prompt(p)) for p in heldout_problems(prompts, seed=3)]
    with tempfile.TemporaryDirectory(prefix="drafts-") as tmp:
        files = variant_files(pair.draft_hf, pair.draft_gguf, Path(tmp))
        typer.echo(f"Draft variants on {prompts} prompts, rounds of {tokens} drafts, 1 thread")
        for name in VARIANTS:
            path = files[name]
            fig = DraftFigure(name, path.stat().st_size, acceptance(path, target, ids, max_new),
                              agent_rate(path, ids, tokens, seconds),
                              raw_rate(path, ids, tokens, seconds))  # fmt: skip
            typer.echo(
                f"  {name:5s} {fig.bytes / 1024:7.1f} KiB  acceptance {fig.acceptance:.3f}  "
                f"agent {fig.agent_tok_s:8.0f} tok/s  raw llama-cpp-python "
                f"{fig.raw_tok_s:8.0f} tok/s  agent/raw {fig.agent_vs_raw:.1%} (goal >= 95 %)"
            )


def dilation(
    devices: int = typer.Option(8, help="devices (Pi 5 class) in the condition"),
    problems: int = typer.Option(4, help="problems per device"),
    dilations: str = typer.Option("1,2,4", help="time dilations to compare, comma-separated"),
) -> None:
    """The same condition at dilations 1, 2, 4: emulated-time figures and answers compared."""
    import tempfile

    from testbed.bench.dilation import answers, scaled_playbook
    from testbed.results.store import RunStore
    from testbed.runner.run import execute

    try:
        factors = [float(x) for x in dilations.split(",")]
    except ValueError:
        raise typer.BadParameter("expected numbers like 1,2,4", param_hint="--dilations") from None
    with tempfile.TemporaryDirectory() as tmp:
        book = scaled_playbook(devices, problems, factors, Path(tmp))
        outcome = execute(book, out=Path(tmp) / "runs", say=typer.echo)
        assert outcome.store is not None
        journal = RunStore(outcome.store.root).journal()
        first = None
        typer.echo(
            f"\nSLED, {devices} Pi 5 devices (Llama-3.2-1B q4_0) + A100 (Llama-3.1-8B), 85 ms, "
            f"{problems} problems each; figures in emulated time"
        )
        typer.echo(
            f"{'dilation':>9}{'verified tok/s':>16}{'ratio':>8}{'e2e p50 ms':>12}"
            f"{'behind':>10}{'same tokens':>13}"
        )
        for entry in journal:
            m = entry.get("metrics") or {}
            n = entry["values"]["lab.time_dilation"]
            if entry["status"] != "done":
                typer.echo(f"{n:>9g}  failed: {entry.get('reason')}")
                continue
            got = answers(outcome.store.root, entry["condition"])
            if first is None:
                first = (m["system_verified_tok_s"], got)
            same = sum(got.get(k) == v for k, v in first[1].items())
            typer.echo(
                f"{n:>9g}{m['system_verified_tok_s']:>16.2f}"
                f"{m['system_verified_tok_s'] / first[0]:>8.3f}{m['e2e_p50_ms']:>12.1f}"
                f"{m['behind_forwards']:>5}/{m['paced_forwards']:<4}"
                f"{same:>6}/{len(first[1]):<6}"
            )


def twin(
    runs: list[Path] = typer.Argument(..., help="lab run folders of SLED / centralized playbooks"),
) -> None:
    """The twin against the lab: each done condition of the runs simulated with the lab's
    measured acceptance, figure beside figure with its error."""
    from rich.console import Console
    from rich.table import Table

    from testbed.bench.twin import validate_runs, validation_rows, within_goal

    with exit_codes():
        points = validate_runs(runs)
    headers, rows = validation_rows(points)
    table = Table(title="twin against lab (err: twin / lab - 1)")
    for h in headers:
        table.add_column(h, justify="left" if h in ("condition", "mode") else "right")
    for cells in rows:
        table.add_row(*cells)
    console = Console(width=200)
    console.print(table)
    for name, (ok, spread, n) in within_goal(points).items():
        console.print(f"{name}: {ok} of {n} points within the goal, {spread} of {n} within one "
                      "standard deviation of the twin's draws")  # fmt: skip


def twin_scale(
    playbook: Path = typer.Argument(
        Path("experiments/seed-sled-vs-centralized.yaml"),
        help="playbook (its first SLED and first centralized condition)",
    ),
    devices: int = typer.Option(10_000, min=1, help="devices simulated"),
    acceptance: float = typer.Option(0.8, min=0.0, max=1.0, help="per-token acceptance"),
) -> None:
    """The twin at fleet scale: wall time, simulated time, devices per second, peak memory."""
    from testbed.bench.twin import fleet_scale

    with exit_codes():
        points = fleet_scale(playbook, devices, acceptance)
    for p in points:
        typer.echo(f"{p.mode:12s} {p.devices:>7,} devices: {p.wall_s:6.1f} s wall for "
                   f"{p.simulated_s:7.1f} s simulated ({p.rounds:,} rounds, "
                   f"{p.fallback_share:.0%} of tokens unverified), "
                   f"{p.devices_per_s:,.0f} devices/s, peak {p.peak_mb:,.0f} MB")  # fmt: skip
