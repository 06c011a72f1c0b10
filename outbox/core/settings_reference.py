"""The settings reference, generated from the settings' own declarations: every core setting and
every shipped backend's section, with its variable, its default and its sentence.

    python -m outbox.core.settings_reference            # rewrite the block in docs/configuration.md
    python -m outbox.core.settings_reference --check    # exit 1 if the block is stale

Why generated: the hand-written table drifted from the code (settings were missing from it). The
block sits between ``<!-- settings:reference -->`` and ``<!-- /settings:reference -->`` (as
``benchmarks/report.py`` writes its results blocks), everything between the markers is
overwritten, and tests/test_settings_reference.py fails when the committed block is stale. A third
party documents its own section with ``section_table(MyOptions)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

from outbox.core.settings import Settings
from outbox.core.settings_backends import SHIPPED
from outbox.core.settings_sections import ENV_PREFIX, BackendOptions
from outbox.core.settings_values import DOC, shown_default

NAME = "reference"
BLOCK = re.compile(r"(<!-- settings:([\w-]+) -->\n)(.*?)(<!-- /settings:\2 -->)", re.S)
DOCUMENT = Path("docs") / "configuration.md"


def _row(*cells: str) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _doc(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get(DOC, ""))


def core_table() -> str:
    """One row per core setting, in declaration order."""
    lines = [_row("setting", "variable", "default", "meaning"), "|---|---|---|---|"]
    for f in dataclasses.fields(Settings):
        variable = "—" if f.name == "sections" else f"`{ENV_PREFIX}{f.name.upper()}`"
        lines.append(_row(f"`{f.name}`", variable, shown_default(f), _doc(f)))
    return "\n".join(lines) + "\n"


def section_table(options: type[BackendOptions]) -> str:
    """``options``'s section: its heading, its sentence and one row per key."""
    about = " ".join(line.strip() for line in (options.__doc__ or "").strip().splitlines())
    flat = (
        f" Before sections these were the flat settings `{options.SECTION}_*`; a settings file "
        "that still uses them works and logs a deprecation notice naming the new spelling."
        if options.FLAT
        else ""
    )
    lines = [
        f"### `[{options.SECTION}]`",
        "",
        f"{about}{flat}",
        "",
        _row("key", "variable", "default", "meaning"),
        "|---|---|---|---|",
    ]
    for key, f in options.option_fields().items():
        lines.append(_row(f"`{key}`", f"`{options.variable(key)}`", shown_default(f), _doc(f)))
    return "\n".join(lines) + "\n"


def render_block() -> str:
    """What sits between the markers."""
    return "\n".join([core_table(), *(section_table(o) for o in SHIPPED)])


def render(text: str) -> str:
    """``text`` with its settings block regenerated (an unknown block name raises KeyError)."""
    renderers = {NAME: render_block}

    def fill(m: re.Match[str]) -> str:
        return m.group(1) + renderers[m.group(2)]() + m.group(4)

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only report a stale block")
    ap.add_argument("--file", type=Path, default=DOCUMENT, help="the page holding the block")
    args = ap.parse_args(argv)
    text = args.file.read_text()
    fresh = render(text)
    if fresh == text:
        return 0
    if args.check:
        print(f"stale: {args.file}")
        return 1
    args.file.write_text(fresh)
    print(f"rewrote: {args.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
