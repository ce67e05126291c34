"""distrun check's report for people: one row per check and one column per node (its marks, or
ok and FAIL where the output's encoding cannot hold them), then what failed where and its fix."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from distrun.ui.console import console, current_console, print_table, styled


def _marks() -> dict[bool | None, str]:
    """✓ and ✗, or words where the output's encoding cannot hold them (PYTHONIOENCODING=ascii)."""
    encoding = getattr(current_console(console).file, "encoding", None) or "utf-8"
    try:
        "✓✗".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return {None: "-", True: "ok", False: "FAIL"}
    return {None: "-", True: "✓", False: "✗"}


def print_check_report(report: dict) -> None:
    """'distrun check': one row per check, one column per node (✓/✗, '-' not checked), then
    what failed where and its fix."""
    hosts = list(report.get("hosts") or {})
    marks = _marks()
    rows = [[check, *(marks[None if items.get(h) is None else bool(items[h]["ok"])] for h in hosts)]
            for check, items in report["checks"].items()]
    if not current_console(console).is_terminal:
        print_table(["check", *hosts], rows)
    else:
        table = Table(show_edge=False, pad_edge=False)
        table.add_column("check")
        for h in hosts:
            table.add_column(styled(h), justify="center")
        colour = {marks[True]: styled((marks[True], "green")), marks[False]: styled((marks[False], "red")), "-": Text("-")}
        for check, *cells in rows:
            table.add_row(styled(check), *(colour[c] for c in cells))
        console.print(table)
    failures = [(c, h, it) for c, items in report["checks"].items() for h, it in items.items() if not it["ok"]]
    for check, host, item in failures:
        console.print(styled((f"{marks[False]} {check} on {host}:", "red"), " ", str(item["detail"])), soft_wrap=True)
        if item.get("fix"):
            console.print(styled("    fix: ", str(item["fix"])), soft_wrap=True)
    verdict = "[green]all checks passed[/green]" if report["ok"] else f"[red]{len(failures)} check(s) failed[/red]"
    console.print(f"{verdict} in {report.get('elapsed_s', 0):.1f}s")
