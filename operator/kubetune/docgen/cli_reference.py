"""The CLI reference, from the same argparse parsers `kubetune --help` prints."""
from __future__ import annotations

import argparse

from kubetune.docgen.markdown import GENERATED, table


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _default(action: argparse.Action) -> str:
    if action.default in (None, False, [], "", argparse.SUPPRESS) or action.option_strings == []:
        return ""
    return f"`{action.default}`"


def render() -> str:
    from kubetune.cli import SUBCOMMANDS, build_parser
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = ["# Command line: `kubetune`\n\n", GENERATED.format(source="operator/kubetune/cli.py and each sub-command's add_arguments"),
           f"{parser.description}\n\n",
           table(["command", "what it does"], [(f"[`kubetune {name}`](#kubetune-{name})", help_text)
                                              for name, (_, help_text) in SUBCOMMANDS.items()]), "\n"]
    for name, sub in subparsers.choices.items():
        usage = " ".join(sub.format_usage().split())
        out.append(f"## kubetune {name}\n\n{sub.description or ''}\n\n```text\n{usage.removeprefix('usage: ')}\n```\n\n")
        rows = []
        for action in _actions(sub):
            names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
            if action.choices and not action.option_strings:
                names += " (" + " \\| ".join(map(str, action.choices)) + ")"
            rows.append((names, _default(action), action.help or ""))
        if rows:
            out.append(table(["argument", "default", "meaning"], rows) + "\n")
    return "".join(out)
