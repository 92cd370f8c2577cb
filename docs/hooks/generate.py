"""MkDocs hook (mkdocs.yml `hooks:`): adds the pages generated from the code to the site, so the
config, CLI and exit-code references are rebuilt from the schema, the parser and
fleetrl/exit_codes.py on every build and cannot drift from them. Cross-references in field docstrings, `(docs: guides/model.md, Section)`, become
links to that page and section."""

from __future__ import annotations

import os
import re

os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal: the same page everywhere

import cli_reference  # noqa: E402 (mkdocs puts this folder on sys.path while it loads the hook)
import config_reference  # noqa: E402
import exit_codes_reference  # noqa: E402
from mkdocs.structure.files import File  # noqa: E402

DOCS_REF = re.compile(r"docs: ([\w/.-]+\.md)(?:, ([^;)]+))?")


def slug(title: str) -> str:
    """The anchor MkDocs gives a heading (its default `toc` slugify)."""
    text = re.sub(r"[^\w\s-]", "", title).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def link_docs_refs(text: str, page: str) -> str:
    """`docs: guides/model.md, Token-level action policies` → a relative link from `page`."""
    up = "../" * page.count("/")

    def link(match: re.Match) -> str:
        target, section = match.group(1), match.group(2)
        if section:
            return f"see [{section.strip()}]({up}{target}#{slug(section)})"
        return f"see [{target.removesuffix('.md')}]({up}{target})"

    return DOCS_REF.sub(link, text)


def on_files(files, config):
    for module in (config_reference, cli_reference, exit_codes_reference):
        content = link_docs_refs(module.page(), module.PAGE)
        files.append(File.generated(config, module.PAGE, content=content))
    return files
