"""`testbed dashboard [RESULTS] [--serve]`: HTML dashboards of runs and their index page."""

from __future__ import annotations

from pathlib import Path

import typer

from testbed.commands.exits import exit_codes
from testbed.core.errors import ExitCode


def dashboard(
    results: Path | None = typer.Argument(
        None, help="a results folder (default results/) or one run folder"
    ),
    tolerances: Path | None = typer.Option(
        None, help="tolerance file for the regression flags (default: the built-in one)"
    ),
    serve: bool = typer.Option(False, "--serve", help="serve the pages on localhost after"),
    port: int = typer.Option(8765, help="port for --serve (127.0.0.1 only)"),
) -> None:
    """Write <run>/dashboard.html for every run and <results>/index.html over them all.

    The pages open from disk (no server, no internet); --serve also serves them locally.
    """
    from testbed.core.paths import results_dir
    from testbed.report.compare import load_tolerances
    from testbed.report.dashboard import write_index, write_run_page
    from testbed.report.data import load_run, run_folders

    folder = Path(results) if results else results_dir()
    with exit_codes():
        if (folder / "manifest.json").is_file():
            page = write_run_page(load_run(folder))
            typer.echo(f"dashboard: {page}")
            root = folder
        else:
            if not folder.is_dir():
                typer.echo(f"{folder}: no such folder", err=True)
                raise typer.Exit(ExitCode.BAD_INPUT)
            runs = run_folders(folder)
            if not runs:
                typer.echo(f"{folder}: no run folders yet (run `testbed run PLAYBOOK`)", err=True)
                raise typer.Exit(ExitCode.BAD_INPUT)
            pages = [write_run_page(run) for run in runs]
            index = write_index(folder, runs, load_tolerances(tolerances))
            typer.echo(f"index: {index} ({len(runs)} runs)")
            typer.echo(f"dashboard: {pages[-1]}")
            root = folder
    if serve:
        serve_folder(root, port)


def serve_folder(root: Path, port: int) -> None:
    """Serve root on 127.0.0.1:port until interrupted."""
    import contextlib
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    with ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        typer.echo(f"serving {root} on http://127.0.0.1:{port}/ (Ctrl-C stops)")
        with contextlib.suppress(KeyboardInterrupt):
            httpd.serve_forever()
