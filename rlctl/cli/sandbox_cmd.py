"""`rlctl sandbox check`: which protections model-written code gets on this machine."""

from __future__ import annotations

import typer

from rlctl.cli.common import emit, format_option

sandbox_app = typer.Typer(help="The sandbox that runs model-written code (the code reward, the python tool).",
                          no_args_is_help=True)


@sandbox_app.command("check")
def check(fmt: str = format_option("text", "json", help="text or json.")) -> None:
    """Run a short hostile suite (loop, fork bomb, 10 GB, output flood, network, files, kill) here.

    Exit 0 when every protection this machine claims holds; a claimed one that fails is a bug
    (exit 1). Protections that need namespaces show as "not protected" where there are none.

    Example: rlctl sandbox check --format json
    """
    from rlctl.errors import RlctlError
    from rlctl.sandbox.check import run_checks

    report = run_checks()
    emit(report, fmt)
    if fmt == "text":
        _print(report)
    if not report["ok"]:
        failed = ", ".join(c["name"] for c in report["checks"] if c["claimed"] and not c["passed"])
        raise RlctlError(f"sandbox check failed: {failed}", hint="please report this with `rlctl doctor` output.")


def _print(report: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    style = "green" if report["namespaces"] else "bold yellow"
    console.print(f"sandbox: [{style}]{escape(report['mode'])}[/]", highlight=False)
    table = Table("check", "result", "detail")
    for c in report["checks"]:
        result = "[green]pass[/]" if c["passed"] else ("[red]FAIL[/]" if c["claimed"] else "[yellow]not protected[/]")
        table.add_row(escape(c["name"]), result, escape(c["detail"]))
    console.print(table)
    for name, active in report["protections"].items():
        console.print(f"  {'[green]active[/]' if active else '[yellow]missing[/]'}  {escape(name)}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
