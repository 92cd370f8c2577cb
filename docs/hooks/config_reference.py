"""docs/reference/config.md, written from the schema at build time so that it cannot drift.

Every key of every section (`fleetrl.config.schema.SECTION_TYPES`, and the `algorithm` section of
each registered algorithm) is one row: its type, default, valid values (the `Literal` choices and
the `constraints.py` markers on its annotation) and meaning (the docstring under its field, read
with `ast`, as dataclasses keep no field docstrings at run time).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from functools import cache

import yaml

from fleetrl.algos.registry import algorithm_names, algorithm_spec
from fleetrl.config.constraints import Check, Note, Range
from fleetrl.config.model_sections import MODEL_SECTIONS, CustomModelConfig, ModelConfig
from fleetrl.config.schema import SECTION_TYPES, AlgorithmConfig, Config

PAGE = "reference/config.md"


@cache
def class_docstrings(cls: type) -> dict[str, str]:
    """{field name: the string literal right under its annotated assignment} in `cls`'s own body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def field_docstring(cls: type, name: str) -> str | None:
    """The docstring of field `name` where it is declared (`cls` or the base it inherits it from)."""
    for owner in cls.__mro__:
        if name in owner.__dict__.get("__annotations__", {}):
            return class_docstrings(owner).get(name)
    return None


def section_keys() -> list[tuple[str, type, list[str]]]:
    """(title, dataclass, its field names to list): every section, each followed by the sections
    nested in it (`model.lora`); `algorithm` as its common keys, then each registered algorithm's
    own (an algorithm whose config extends another registered one's lists only what it adds)."""
    found = []
    for prefix, section in SECTION_TYPES.items():
        if prefix == "model":
            found += model_sections()
            continue
        if prefix != "algorithm":
            found += with_nested(prefix, section, [f.name for f in dataclasses.fields(section)])
            continue
        found.append(("algorithm", AlgorithmConfig, [f.name for f in dataclasses.fields(AlgorithmConfig)]))
        configs = {name: algorithm_spec(name).config for name in algorithm_names()}
        for name, config in configs.items():
            parents = [c for c in configs.values() if c is not config and issubclass(config, c)]
            inherited = {f.name for parent in parents for f in dataclasses.fields(parent)}
            inherited |= {f.name for f in dataclasses.fields(AlgorithmConfig)}
            found.append(
                (f"algorithm ({name})", config, [f.name for f in dataclasses.fields(config) if f.name not in inherited])
            )
    return found


def model_sections() -> list[tuple[str, type, list[str]]]:
    """`model` as the keys every kind reads, then each kind's own (`model (hf)`), each followed by
    the sections nested in it (`model.lora`). A kind's `id` is listed with the common keys only."""
    common = {f.name for f in dataclasses.fields(ModelConfig)}
    found = [("model", ModelConfig, [f.name for f in dataclasses.fields(ModelConfig)])]
    for kind, section in [*MODEL_SECTIONS.items(), ("module:attr", CustomModelConfig)]:
        own = [f.name for f in dataclasses.fields(section) if f.name not in common or f.name in section.__annotations__]
        found += with_nested(f"model ({kind})", section, [name for name in own if name != "id"])
    return found


def with_nested(prefix: str, section: type, names: list[str]) -> list[tuple[str, type, list[str]]]:
    """The section, then each dataclass-typed field of it as a section of its own (`model.lora`)."""
    found = [(prefix, section, names)]
    hints = typing.get_type_hints(section)
    for name in names:
        inner, _ = strip_optional(hints[name])
        if dataclasses.is_dataclass(inner):
            nested = f"{prefix.split()[0]}.{name}"
            found += with_nested(nested, inner, [f.name for f in dataclasses.fields(inner)])
    return found


def strip_optional(hint) -> tuple[object, bool]:
    """(the hint without `| None`, whether None is allowed); the schema's unions are all `X | None`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner, True
    return hint, False


def describe(hint) -> tuple[str, list[str]]:
    """(the type as YAML calls it, what is valid) for one annotation."""
    valid: list[str] = []
    markers: list[object] = []
    while True:  # peel Annotated and Optional layers, in either order
        if typing.get_origin(hint) is typing.Annotated:
            markers += list(hint.__metadata__)
            hint = typing.get_args(hint)[0]
            continue
        inner, optional = strip_optional(hint)
        if optional:
            hint = inner
            valid.append("null")
            continue
        break
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        kind = "string"
        valid.insert(0, "one of " + ", ".join(f"`{choice}`" for choice in typing.get_args(hint)))
    elif origin is list:
        element, element_valid = describe(typing.get_args(hint)[0])
        kind = f"list of {element}"
        valid[:0] = [f"each {text}" for text in element_valid]
    elif origin is dict and typing.get_args(hint):
        names, _ = describe(typing.get_args(hint)[0])
        element, element_valid = describe(typing.get_args(hint)[1])
        kind = f"mapping of {names} to {element}"
        valid[:0] = [f"each value {text}" for text in element_valid]
    else:
        kind = (
            "mapping"
            if dataclasses.is_dataclass(hint)
            else {bool: "bool", int: "int", float: "float", str: "string", dict: "mapping"}.get(hint, str(hint))
        )
    for marker in markers:
        if isinstance(marker, Range):
            valid.insert(0, marker.describe() or "finite")
        elif isinstance(marker, Check):
            valid.insert(0, marker.expected)
        elif isinstance(marker, Note):
            valid.append(marker.text)
    return kind, valid


def default_text(field: dataclasses.Field) -> str:
    value = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("\n...").strip()


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def section_table(title: str, section: type, names: list[str]) -> str:
    prefix = title.split()[0]
    hints = typing.get_type_hints(section, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(section)}
    rows = ["| key | type | default | valid | meaning |", "| --- | --- | --- | --- | --- |"]
    for name in names:
        kind, valid = describe(hints[name])
        if f"{prefix}.{name}" == "algorithm.name":  # the registry's names, not the schema's: config/ names none
            valid.insert(
                0, "one of " + ", ".join(f"`{algorithm}`" for algorithm in algorithm_names()) + ", or a plugin's"
            )
        doc = field_docstring(section, name) or ""
        rows.append(
            f"| `{prefix}.{name}` | {kind} | `{cell(default_text(fields[name]))}` | {cell('; '.join(valid))} | {cell(doc)} |"
        )
    return "\n".join(rows)


def section_intro(title: str, section: type) -> str:
    if title == "algorithm":
        return "The keys every algorithm reads. `algorithm.name` chooses the algorithm, whose own keys follow."
    own = section.__dict__.get("__doc__") or ""
    own = "" if own.startswith(f"{section.__name__}(") else inspect.cleandoc(own)  # not dataclass's generated one
    if title.startswith("algorithm ("):
        return f"With `algorithm.name: {title[11:-1]}`. {own}".strip()
    if title.startswith("model ("):
        return own
    return own or field_docstring(Config, title) or ""


def page() -> str:
    parts = [
        "# Config keys",
        "",
        "Generated from `fleetrl/config/schema.py` and each registered algorithm's config section when "
        "the site is built: the docstring under each field is its meaning here. Every key is checked "
        "before anything starts; a bad value is exit 2 with one message naming the key, the value and "
        "what is valid, and an unknown key gets a suggestion (`algorithm.gama` → did you mean `gamma`?). "
        "Rules that relate several keys (a minibatch dividing the batch, a placement within the cluster) "
        "are checked at the same time. Set a key in the YAML file or on the command line as "
        "`section.key=value` (values are read as YAML).",
        "",
    ]
    for title, section, names in section_keys():
        parts += [f"## {title}", "", section_intro(title, section), "", section_table(title, section, names), ""]
    return "\n".join(parts)
