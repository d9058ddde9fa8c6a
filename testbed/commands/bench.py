"""`testbed bench ...`: benchmarks that print measured figures and ratios."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from testbed.commands.number_lists import numbers

app = typer.Typer(
    help="Benchmarks: figures measured side by side in one run.", no_args_is_help=True
)


@app.command("sd")
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


@app.command("verify")
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


@app.command("gpu")
def gpu(
    pair: Path | None = typer.Argument(None, help="tiny pair folder (default: the cached one)"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the figures here"),
) -> None:
    """The server side on a CUDA machine (GPU_CHECK_DEVICE=cpu to try it here): batched
    verification, SD vs AD, the SLED server over loopback."""
    from testbed.bench.gpu import main
    from testbed.models.tiny import ensure_tiny_pair

    main(pair or ensure_tiny_pair().root, json_out)


@app.command("hardware")
def hardware(
    json_out: Path | None = typer.Option(None, "--json", help="also write the figures here"),
    fit: bool = typer.Option(False, "--fit", help="refit every entry; print values and YAML"),
    write: bool = typer.Option(False, "--write", help="with --fit: rewrite the catalogue"),
    catalogue: Path | None = typer.Option(
        None, "--catalogue", help="catalogue file (default: topologies/hardware.yaml)"
    ),
    live: bool = typer.Option(True, "--live/--no-live", help="measure this CPU's points live"),
) -> None:
    """The cost model against every calibration point of the hardware catalogue: published
    vs predicted step times, error, a plain roofline; this CPU measured live; the pacing's
    own error on this machine."""
    from rich.console import Console

    from testbed.bench.hardware import run
    from testbed.bench.pacing import run_pacing
    from testbed.core.errors import ExitCode, TestbedError
    from testbed.topo.catalogue import DEFAULT_PATH

    if write and not fit:
        typer.echo("--write: only with --fit (it writes the refitted values)", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT)
    try:
        with Console(stderr=True).status("bench hardware") as status:
            run(
                catalogue or DEFAULT_PATH,
                echo=typer.echo,
                progress=lambda msg: status.update(msg),
                refit=fit,
                write=write,
                live=live,
                json_out=json_out,
            )
            if not fit:
                pacing = run_pacing(typer.echo, lambda msg: status.update(msg))
                if json_out:
                    figures = json.loads(json_out.read_text())
                    json_out.write_text(json.dumps({**figures, "pacing": pacing}, indent=1))
    except TestbedError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(exc.exit_code) from None


from testbed.commands.calibrate import link as _link  # noqa: E402

app.command("link")(_link)
from testbed.bench.dilation import cli as _dilation  # noqa: E402
from testbed.bench.drafting import cli as _drafting  # noqa: E402
from testbed.bench.lab_paths import cli as _lab_paths  # noqa: E402
from testbed.bench.sled_loss import cli as _sled_loss  # noqa: E402

app.command("sled-loss")(_sled_loss)
app.command("dilation")(_dilation)
app.command("drafting")(_drafting)
app.command("lab-paths")(_lab_paths)
