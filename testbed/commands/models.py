"""`testbed models ...`: build the tiny pair, check a draft/target pair across engines."""

from __future__ import annotations

from pathlib import Path

import typer

from testbed.core.errors import ExitCode


def build_tiny(
    out: Path | None = typer.Option(
        None, "--out", help="also copy the pair into this folder", file_okay=False
    ),
) -> None:
    """Build (or find in the cache) the tiny draft/target pair and print its headline figures."""
    from rich.console import Console
    from rich.table import Table

    from testbed.models.tiny import ensure_tiny_pair

    console = Console()
    with console.status("tiny pair: looking in the cache") as status:
        pair = ensure_tiny_pair(out, progress=lambda msg: status.update(f"tiny pair: {msg}"))
    m = pair.manifest
    console.print(f"tiny pair: [bold]{pair.root}[/bold]", soft_wrap=True)
    table = Table()
    cols = ("model", "params", "layers x hidden", "train steps", "held-out exact match",
            "agreement with target")  # fmt: skip
    for col in cols:
        table.add_column(col)
    for name, info in m["models"].items():
        shape = info["shape"]
        agree = info.get("agreement")
        table.add_row(
            name,
            f"{info['params']:,}",
            f"{shape['layers']} x {shape['hidden']}",
            str(info["train"]["steps"]),
            f"{info['heldout']['exact_match']:.1%} of {info['heldout']['n']}",
            f"{agree['draft_vs_target_greedy']:.1%}" if agree else "-",
        )
    console.print(table)
    console.print(
        "agreement: the draft's greedy token equals the target's, teacher-forced on the "
        "target's held-out answers; drafts other than `draft` are the graded family "
        "(models.draft_grade)"
    )
    console.print(
        f"tokenizer {m['tokenizer']['hash'][:16]} ({m['tokenizer']['vocab_size']} tokens); "
        f"recipe {m['recipe_hash']}; built in {m['build_wall_s']:.0f} s",
        highlight=False,
    )
    console.print(f"  target: {pair.target_hf}/  {pair.target_gguf}", highlight=False,
                  soft_wrap=True)  # fmt: skip
    for name in pair.draft_names:
        hf, gguf = pair.draft_files(name)
        console.print(f"  {name}: {hf}/  {gguf}", highlight=False, soft_wrap=True)


def check(
    draft: Path = typer.Argument(
        ..., help="draft model: HF folder, .gguf file, or a tiny-pair folder (then omit TARGET)"
    ),
    target: Path | None = typer.Argument(None, help="target model: HF folder or .gguf file"),
    prompts: int = typer.Option(20, help="held-out problems for logits and greedy answers"),
    max_new: int = typer.Option(48, help="greedy tokens per answer at most"),
    threads: int = typer.Option(2, help="CPU threads of each engine"),
    strict: bool = typer.Option(
        False, help="exit 1 unless tokenizers and greedy answers agree 100%"
    ),
) -> None:
    """Load each model in both engines; report tokenizer, logit and greedy agreement."""
    from rich.console import Console

    from agents.engines.base import TokenizerMismatchError
    from testbed.core.errors import BadInputError
    from testbed.models.check import check_pair, render, sources

    console = Console()
    try:
        with console.status("checking") as status:
            report = check_pair(
                draft, target, prompts, max_new, threads, say=lambda msg: status.update(msg)
            )
    except TokenizerMismatchError as e:
        console.print(f"[red]refused:[/red] {e}", highlight=False)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    except BadInputError as e:
        console.print(f"[red]error:[/red] {e}", highlight=False)
        raise typer.Exit(e.exit_code) from None
    for line in sources(report):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(render(report))
    console.print(f"shared tokenizer: {report.tokenizer_hash}", highlight=False, soft_wrap=True)
    for m in (report.draft, report.target):
        for line in m.mismatches[:5]:
            console.print(f"  [yellow]{m.source.name}[/yellow]: {line}", highlight=False)
    if strict and not report.all_identical:
        raise typer.Exit(ExitCode.FAILED)
