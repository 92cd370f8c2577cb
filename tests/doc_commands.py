"""The `fleetrl` commands the README and the docs show, as a user would copy them.

A command is a line of a ```bash block in README.md or docs/**/*.md that starts with `fleetrl `
or `.venv/bin/fleetrl ` (after optional `NAME=value` environment assignments), with its trailing
`# comment` removed and `\\`-continued lines joined. A line with a placeholder — `<run>`, or `...`
standing for the reader's own values — is not runnable as written and is left out. The same
command shown on two pages is run once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:\.venv/bin/)?fleetrl\s")
COMMENT = re.compile(r"\s+#(?:\s.*)?$")
PLACEHOLDER = re.compile(r"<[^<>\s]+>|(?:^|[\s=])\.\.\.(?:\s|$)")


@dataclass(frozen=True)
class DocCommand:
    line: str  # the command as written, comment removed
    where: str  # file:line of its first appearance

    @property
    def words(self) -> list[str]:
        """The words from `fleetrl` on (environment assignments dropped)."""
        words = self.line.split()
        start = next(i for i, word in enumerate(words) if word.endswith("fleetrl"))
        return words[start:]


def documentation_files(repo: Path) -> list[Path]:
    docs = repo / "docs"
    return [repo / "README.md", *(sorted(docs.rglob("*.md")) if docs.is_dir() else [])]


def doc_commands(repo: Path) -> list[DocCommand]:
    """Every runnable documented command, in the order of the files and of the lines in them."""
    found: dict[str, DocCommand] = {}
    for path in documentation_files(repo):
        text = path.read_text()
        for block in FENCE.finditer(text):
            first_line = text.count("\n", 0, block.start(1)) + 1
            for offset, line in logical_lines(block.group(1)):
                line = COMMENT.sub("", line).strip()
                runnable = not PLACEHOLDER.search(line)
                if COMMAND.match(line) and runnable and line not in found:
                    found[line] = DocCommand(line, f"{path.relative_to(repo)}:{first_line + offset}")
    return list(found.values())


def logical_lines(block: str) -> list[tuple[int, str]]:
    """(offset of its first physical line, the line with `\\` continuations joined)."""
    lines, pending, start = [], "", 0
    for offset, physical in enumerate(block.splitlines()):
        if not pending:
            start = offset
        if physical.rstrip().endswith("\\"):
            pending += physical.rstrip()[:-1] + " "
            continue
        lines.append((start, pending + physical))
        pending = ""
    if pending:
        lines.append((start, pending))
    return lines
