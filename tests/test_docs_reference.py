"""The documentation's reference pages cannot drift from the code: every config key has a
docstring under its field and a row on the generated config page, every command and option of the
parser is on the CLI page, the exit-code page has every code fleetrl/exit_codes.py defines, and
the hand-written incident-cause page lists exactly the causes the code defines. The generated
pages are made by the site's own hook modules (docs/hooks/), as `mkdocs build` makes them."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import sys
import typing

from fleetrl import exit_codes
from fleetrl.algos.registry import algorithm_names, algorithm_spec
from fleetrl.cli import build_parser
from fleetrl.config.model_sections import MODEL_SECTIONS, CustomModelConfig
from fleetrl.config.schema import RESTARTABLE, SECTION_TYPES, Config
from fleetrl.watch.incident import CAUSES
from tests.support import REPO

DOCS = REPO / "docs"
# The keys the README's hand-kept table had lost (issue 22): the generated page must have them.
ONCE_MISSING = (
    "model.image_encoder",
    "model.embed_dim",
    "model.num_layers",
    "model.num_heads",
    "model.patch_size",
    "cluster.simulate_isolation",
    "cluster.simulate_clock_skew_s",
    "cluster.exchange",
    "runner.max_restarts",
    "runner.restart_on",
    "runner.restart_window_s",
    "watchdog.stop_grace_s",
)


def hook(name: str):
    """A module of docs/hooks, imported as the MkDocs hook imports it (its folder on sys.path)."""
    folder = str(DOCS / "hooks")
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, DOCS / "hooks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def sections() -> list[tuple[str, type]]:
    """(prefix, dataclass) of every section a config may hold: the `algorithm` section once per
    registered algorithm, the `model` section once per kind of model, sections nested in a section (`model.lora`), and the top-level Config
    (whose fields are the sections)."""
    found = [(prefix, cls) for prefix, cls in SECTION_TYPES.items() if prefix not in ("algorithm", "model")]
    found += [("algorithm", algorithm_spec(name).config) for name in algorithm_names()]
    found += [("model", cls) for cls in (*MODEL_SECTIONS.values(), CustomModelConfig)]
    for prefix, cls in found:  # grows while walked: nested sections' own nested ones too
        for name, hint in typing.get_type_hints(cls).items():
            inner = [t for t in typing.get_args(hint) or (hint,) if dataclasses.is_dataclass(t)]
            found += [(f"{prefix}.{name}", t) for t in inner]
    return [("", Config), *found]


def test_every_config_field_has_a_docstring_under_it():
    reference = hook("config_reference")
    missing = [
        f"{cls.__name__}.{f.name}"
        for _, cls in sections()
        for f in dataclasses.fields(cls)
        if not (reference.field_docstring(cls, f.name) or "").strip()
    ]
    assert missing == []


def test_the_config_page_has_every_key_with_its_type_default_and_meaning():
    reference = hook("config_reference")
    page = reference.page()
    keys = {f"{prefix}.{f.name}" for prefix, cls in sections() if prefix for f in dataclasses.fields(cls)}
    rows = {match.group(1): row for row in page.splitlines() if (match := re.match(r"\| `([\w.]+)` \|", row))}
    assert sorted(set(ONCE_MISSING) - keys) == []
    assert sorted(keys - set(rows)) == []
    assert sorted(set(rows) - keys) == []
    assert rows["env.num_envs"] == (
        "| `env.num_envs` | int | `8` | > 0 | Simulators in total, split evenly over the env workers. |"
    )
    assert rows["actor.fsdp_param_dtype"].startswith(
        "| `actor.fsdp_param_dtype` | string | `null` | one of `float32`, `bfloat16`; null; float16 is not offered"
    )
    for row in rows.values():  # type, default and meaning in every row
        key, kind, default, _valid, meaning = (cell.strip() for cell in row.strip("|").split(" | "))
        assert kind and default.startswith("`") and meaning, key


def test_docstring_references_name_pages_and_sections_that_exist():
    generate = hook("generate")
    docstrings = hook("config_reference").page()
    refs = generate.DOCS_REF.findall(docstrings)
    assert len(refs) >= 10
    for page, section in refs:
        assert (DOCS / page).is_file(), page
        text = (DOCS / page).read_text()
        if section:
            headings = {generate.slug(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
            assert generate.slug(section) in headings, (page, section)


def test_the_cli_page_has_every_command_and_option_each_with_help():
    page = hook("cli_reference").page()
    parser = build_parser()
    (group,) = [a for a in parser._actions if a.dest == "command"]
    for name, sub in group.choices.items():
        assert f"## fleetrl {name}\n" in page
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}" in page or f", {option}" in page, (name, option)
            assert action.help, (name, action.dest)


def test_the_incident_causes_page_lists_exactly_the_watchdog_s_causes_and_which_restart():
    text = (DOCS / "reference" / "incident-causes.md").read_text()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL))
    assert list(sections) == list(CAUSES)
    assert [cause for cause, body in sections.items() if "*Restartable.*" in body] == [
        cause for cause in CAUSES if cause in RESTARTABLE
    ]


def test_the_exit_codes_page_lists_every_code_fleetrl_defines_once_each():
    text = hook("exit_codes_reference").page()
    codes = [int(code) for code in re.findall(r"^\| (\d+) \|", text, re.MULTILINE)]
    defined = {
        v for name, v in vars(exit_codes).items() if isinstance(v, int) and name.isupper() and name != "SIGNAL_BASE"
    }
    assert sorted(codes) == codes and set(codes) == defined and len(codes) == len(defined)
    assert codes == [0, 1, 2, 3, 4, 5, 130, 143]  # the numbers users' scripts test: changing one breaks them
