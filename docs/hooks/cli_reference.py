"""docs/reference/cli.md, written from `fleetrl.cli.build_parser()` at build time: every command,
its positional arguments and options with their defaults and help, as `--help` prints them."""

from __future__ import annotations

import argparse

from fleetrl.cli import build_parser

PAGE = "reference/cli.md"


def commands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """{name: (its one-line help, its parser)} in the order the parser lists them."""
    (group,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help or "" for choice in group._choices_actions}
    return {name: (helps.get(name, ""), sub) for name, sub in group.choices.items()}


def argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | what |", "| --- | --- | --- |"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
        else:
            name = action.metavar or action.dest
            name += " …" if action.nargs in ("*", "+") else ""
            name = f"[{name}]" if action.nargs in ("?", "*") else name
        default = (
            "" if action.default in (None, False, argparse.SUPPRESS) or action.nargs == "*" else f"`{action.default}`"
        )
        what = parser._get_formatter()._expand_help(action) if action.help else ""  # fills %(default)s
        what = " ".join(what.split()).replace("|", "\\|")
        rows.append(f"| `{name}` | {default} | {what} |")
    return rows


def page() -> str:
    parser = build_parser()
    parser.prog = "fleetrl"
    parts = [
        "# Command line",
        "",
        "Generated from `fleetrl/cli.py`'s argument parser when the site is built. "
        "`fleetrl --version` prints the installed version; `fleetrl <command> --help` prints what is below. "
        "Exit codes: [Exit codes](exit-codes.md).",
        "",
    ]
    for name, (help_text, sub) in commands(parser).items():
        parts += [f"## fleetrl {name}", "", help_text[:1].upper() + help_text[1:] + ".", ""]
        if sub.description:
            parts += [" ".join(sub.description.split()), ""]
        parts += ["```text", sub.format_usage().strip(), "```", "", *argument_rows(sub), ""]
        if sub.epilog:
            parts += [" ".join(sub.epilog.split()), ""]
    return "\n".join(parts)
