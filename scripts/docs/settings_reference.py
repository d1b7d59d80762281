"""The settings reference of docs/settings.md, generated from the code so that it cannot go stale.

``model.*`` rows come from ``RFTModule``'s arguments and their settings dataclasses: each field's default and its
attribute docstring, the text ``--help`` shows (nested groups such as ``model.policy.lora`` get a table each).
``data.*`` rows and the command's own options come from the parser ``lit-entropy fit`` builds.

    python -m scripts.docs.settings_reference            # print the block
    python -m scripts.docs.settings_reference --update   # write it into docs/settings.md between its markers

``tests/test_docs.py`` checks that docs/settings.md holds exactly what this prints.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "settings.md"
MARKER = "settings-reference"
#: Top-level options of ``lit-entropy fit`` documented here (the others are LightningCLI's own).
COMMAND_OPTIONS = ("val_before_train", "resume_with_changes", "overwrite_run")


def _attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it, through the class's bases (a subclass's own win)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            docstring = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and docstring:
                docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def _value(value: Any) -> str:
    """A default as a YAML config would hold it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if dataclasses.is_dataclass(value):  # a nested group at its defaults (its own table follows)
        return "{}"
    return str(value)


def _text(doc: str) -> str:
    """A docstring as one Markdown table cell (RST double backquotes -> code spans; no bare pipes)."""
    return " ".join(doc.split()).replace("``", "`").replace("|", "\\|").replace(":meth:", "")


def _choices(hint: Any) -> str:
    """`` One of: a, b.`` for a ``Literal`` type (optionally ``| None``); empty otherwise."""
    for part in (hint, *typing.get_args(hint)):
        if typing.get_origin(part) is typing.Literal:
            return " One of: " + ", ".join(f"`{value}`" for value in typing.get_args(part)) + "."
    return ""


def _row(name: str, default: Any, doc: str) -> str:
    return f"| `{name}` | `{_value(default)}` | {_text(doc)} |"


def model_rows(actions: dict[str, Any]) -> list[str]:
    """The ``model`` table (settings that are not groups), then one table per ``model.<group>``, in the order of
    ``RFTModule``'s arguments: every dataclass field, its default and its docstring."""
    from lit_entropy.module import RFTModule

    hints = typing.get_type_hints(RFTModule.__init__)
    names = [name for name in inspect.signature(RFTModule.__init__).parameters if name != "self"]
    groups = {name: _dataclasses_of(hints[name]) for name in names}
    out = ["### `model`", "", "| key | default | meaning |", "|---|---|---|"]
    for name in names:
        if not groups[name]:
            action = actions[f"model.{name}"]
            out.append(_row(name, action.default, (action.help or "") + _choices(hints[name])))
    out.append("")
    for name in names:
        for group in groups[name]:
            out += _group_table(f"model.{name}", group)
    return out


def _dataclasses_of(hint: Any) -> list[type]:
    """The settings dataclasses a type names (``X``, ``X | None``)."""
    return [t for t in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(t) and isinstance(t, type)]


def _group_table(key: str, cls: type) -> list[str]:
    """The table of one settings dataclass, then one for each nested settings group (``model.policy.lora``)."""
    docs, hints = _attribute_docs(cls), typing.get_type_hints(cls)
    out, nested = [f"### `{key}`", "", "| key | default | meaning |", "|---|---|---|"], []
    for field in dataclasses.fields(cls):
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        out.append(_row(field.name, default, docs.get(field.name, "") + _choices(hints[field.name])))
        nested += [(f"{key}.{field.name}", group) for group in _dataclasses_of(hints[field.name])]
    out.append("")
    for name, group in nested:
        out += _group_table(name, group)
    return out


def parser_actions() -> dict[str, Any]:
    """dest -> argparse action of the parser ``lit-entropy fit`` builds (its defaults and help texts)."""
    import sys

    from lit_entropy.cli import cli_main

    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when given args beside a command line
    try:
        parser = cli_main(["--trainer.logger=false", "--trainer.enable_progress_bar=false"], run=False).parser
    finally:
        sys.argv = argv
    return {action.dest: action for action in parser._actions}


def parser_rows(actions: dict[str, Any]) -> list[str]:
    """``data.*`` and the command's own options, from the parser."""
    out = ["### `data`", "", "| key | default | meaning |", "|---|---|---|"]
    for dest, action in actions.items():
        if dest.startswith("data.") and any(option.startswith("--") for option in action.option_strings):
            out.append(_row(dest.removeprefix("data."), action.default, action.help or ""))
    out += ["", "### Options of the command", "", "| option | default | meaning |", "|---|---|---|"]
    out += [_row(f"--{dest}", actions[dest].default, actions[dest].help or "") for dest in COMMAND_OPTIONS]
    return out


def block() -> str:
    """The generated reference, as it stands between the markers of docs/settings.md."""
    header = "<!-- generated by `python -m scripts.docs.settings_reference --update`; do not edit by hand -->"
    actions = parser_actions()
    return "\n".join([header, "", *model_rows(actions), *parser_rows(actions)]) + "\n"


def read_block(path: Path = DOC) -> str:
    """The text between the markers of ``path``."""
    text = path.read_text()
    start, end = f"<!-- {MARKER}:start -->\n", f"<!-- {MARKER}:end -->"
    return text[text.index(start) + len(start) : text.index(end)]


def write_block(new: str, path: Path = DOC) -> bool:
    """Replace the text between the markers of ``path`` with ``new``; True if the file changed."""
    text = path.read_text()
    old = read_block(path)
    updated = text.replace(f"<!-- {MARKER}:start -->\n{old}", f"<!-- {MARKER}:start -->\n{new}", 1)
    path.write_text(updated)
    return updated != text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="write the block into docs/settings.md")
    args = parser.parse_args(argv)
    text = block()
    if args.update:
        changed = write_block(text)
        print(f"{DOC.relative_to(ROOT)}: {'updated' if changed else 'unchanged'}")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
