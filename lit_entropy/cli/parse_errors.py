"""One line for every settings error: ``<dotted key>: <what is wrong>, got <value>``.

jsonargparse reports a bad value as a multi-line dump (every union alternative, every nested parser);
LightningCLI adds the dump of a constructor's error. :func:`explain_parse_error` and
:func:`explain_build_error` read those texts back into the one line ``lit-entropy: error:`` promises
(README, "Troubleshooting"), naming the dotted setting as a user writes it and the value given.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
import typing
from typing import Any

from lit_entropy.internals.cli import parser_settings
from lit_entropy.settings import LEGACY_MODEL_KEYS

__all__ = ["explain_build_error", "explain_parse_error", "setting_keys", "suggest"]

_KEY = re.compile(r'Parser key "([^"]+)":')
_CLASS_PROBLEM = re.compile(r"^(\s*)- Problem with given class_path '([^']+)':\s*$", re.M)
_GIVEN = re.compile(r"^\s*Given value: (.*)$", re.M)
_SUBTYPES = re.compile(r"^\s*Subtypes: (.*)$", re.M)
_SIMPLE = re.compile(r"^\s*Expected a (.+?)\. Got value: (.*)$", re.S)
_NESTED = re.compile(r"NestedArg\(key='([^']*)', val=(.*)\)$")
_CALLABLE_PROBLEM = re.compile(r"^(\s*)- Type .+? expects a function or a callable class: (.*)$", re.M)
_PLAIN_SUBTYPE = re.compile(r"<class '(float|int|str|bool|list|dict)'>|Literal\[|list\[(float|int|str|bool)\]")
_DOTTED_CLASS = re.compile(r"\b([A-Za-z_]\w*(?:\.\w+)*\.[A-Z]\w*)\b")
_PLAIN_TYPES = {
    "float": "a float",
    "int": "an integer",
    "bool": "true or false",
    "str": "a string",
    "NoneType": "null",
    "list": "a list",
    "dict": "a mapping",
    "tuple": "a list",
}


def explain_parse_error(message: str, parser: Any = None) -> str:
    """The one-line form of a jsonargparse parse error ``message`` (``parser``: for setting names to suggest)."""
    text = message.strip()
    first = text.splitlines()[0] if text else "invalid arguments"
    if match := re.match(r"unrecognized arguments: (\S+)(?: (\S+))?", text):
        key, _, value = match[1].lstrip("-").partition("=")
        if not value and match[2] and not match[2].startswith("-"):
            value = match[2]
        return _unknown_setting(key, value or None, parser)
    if match := re.match(r"Subcommand '\w+' does not accept option '([^']+)'", text):
        return _unknown_setting(match[1], None, parser)
    if match := re.match(r"argument --([\w.\-]+): (.*)", first):
        return f"{match[1]}: {match[2]}"
    if match := _KEY.match(text):
        return _explain_key(match[1], text[match.end() :])
    return _one_line(text)


def explain_build_error(err: BaseException, parser: Any = None) -> str:
    """One line for an error raised while LightningCLI builds the model, data, trainer and callbacks.

    A constructor's own message is kept; jsonargparse's dump around it gives the setting (the one whose
    type lists the same union alternatives in ``parser``) and the class that raised.
    """
    text = str(err).strip()
    if "Errors:" not in text:
        return _one_line(text) or type(err).__name__
    errors = text.split("Errors:", 1)[1]
    first = next((line.strip()[2:] for line in errors.splitlines() if line.strip().startswith("- ")), text)
    subtypes = _SUBTYPES.search(text)
    key = _key_for_subtypes(parser, subtypes[1].strip()) if subtypes else None
    if key is not None and first.startswith(key):  # a settings group's own check names its key already
        return _one_line(first)
    given = text.split("Given value:", 1)[1] if "Given value:" in text else ""
    classes = [name.rsplit(".", 1)[-1] for name in re.findall(r"class_path='([^']+)'", given)]
    where = f" ({', '.join(dict.fromkeys(classes))})" if classes else ""
    return _one_line(f"{key}{where}: {first}" if key is not None else f"{first}{where}")


def setting_keys(parser: Any) -> list[str]:
    """Every dotted setting ``parser`` accepts, including the fields of optional settings groups (``model.ppo.*``)."""
    keys: list[str] = []
    for setting in parser_settings(parser):
        for option in setting.options:
            if option.startswith("--") and not option.endswith(".help") and option != "--help":
                keys.append(option[2:])
        for group in (setting.typehint, *typing.get_args(setting.typehint)):
            if dataclasses.is_dataclass(group) and isinstance(group, type):
                keys += [f"{setting.dest}.{field.name}" for field in dataclasses.fields(group)]
    return sorted(set(keys))


def suggest(name: str, choices: typing.Iterable[str]) -> str:
    """`` (did you mean X?)`` for the closest of ``choices``, or an empty string."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


# ----------------------------------------------------------------------------------------------- parse errors


def _unknown_setting(key: str, value: str | None, parser: Any) -> str:
    got = f", got {_show(value)}" if value is not None else ""
    return f"{key}: no such setting{_closest_setting(key, setting_keys(parser) if parser is not None else [])}{got}"


def _closest_setting(key: str, keys: list[str]) -> str:
    """`` (did you mean X?)``: a sibling first (same group), then an old name's new place, then any setting."""
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
    if close := difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6):
        return f" (did you mean {siblings[close[0]]}?)"
    if key.startswith("model."):  # a misspelt old name: suggest where it lives today
        if close := difflib.get_close_matches(key.removeprefix("model."), list(LEGACY_MODEL_KEYS), n=1, cutoff=0.8):
            return f" (did you mean {LEGACY_MODEL_KEYS[close[0]]}?)"
    if siblings:
        return ""
    return suggest(key, keys)


def _explain_key(key: str, body: str) -> str:
    """``key: <what is wrong>, got <value>`` for the text after ``Parser key "key":``."""
    if simple := _SIMPLE.match(body):
        return f"{key}: expected {_describe(simple[1])}, got {_show(simple[2])}"
    if not body.strip().startswith(("-", "Does not validate")) and "Given value:" not in body:
        return f"{key}: {_one_line(body)}"  # e.g. config: File does not exist: '...'
    givens = _GIVEN.findall(body)
    given = givens[-1].strip() if givens else ""
    nested = _NESTED.match(given)
    value = _unquote(nested[2]) if nested else given
    subtypes = _SUBTYPES.search(body)
    bases = _class_names(subtypes[1]) if subtypes else []
    if problem := _CLASS_PROBLEM.search(body):
        block = _block(body, len(problem[1]), problem.end())
        return _explain_class_problem(key, problem[2], block, bases, nested, value)
    if problem := _CALLABLE_PROBLEM.search(body):  # a Callable[..., Optimizer] setting: class_path in the text
        block = problem[2] + "\n" + _block(body, len(problem[1]), problem.end())
        class_path = re.search(r"class_path='([^']+)'", block)
        path = class_path[1] if class_path else value
        return _explain_class_problem(key, path, block, bases, nested if _KEY.search(block) else None, value)
    plain = subtypes is not None and _PLAIN_SUBTYPE.search(subtypes[1])
    if bases and ("does not correspond to a subclass" in body or ("dot import path" in body and not plain)):
        return _class_path_error(key, value, bases)
    wanted = _describe(subtypes[1]) if subtypes else "a valid value"
    return f"{key}: expected {wanted}, got {_show(value)}"


def _explain_class_problem(
    key: str, class_path: str, block: str, bases: list[str], nested: re.Match[str] | None, value: str
) -> str:
    """The error inside one ``class_path`` alternative: a bad init argument, an unknown one, or no import."""
    inner = block.strip()
    group = _is_settings_group(class_path)
    prefix = f"{key}." if group else f"{key}.init_args."
    where = "" if group else f" ({class_path.rsplit('.', 1)[-1]})"
    if match := _KEY.search(inner):
        argument, _, rest = _explain_key(match[1], _strip_got_value(inner[match.end() :])).partition(": ")
        return f"{prefix}{argument}{where}: {rest}"
    if match := re.search(r"Option '([^']+)' is not accepted", inner):
        names = _init_arguments(class_path)
        return f"{prefix}{match[1]}{where}: no such argument{suggest(match[1], names)}, got {_show(value)}"
    if nested is None and not group:
        return _class_path_error(key, class_path, bases)
    return f"{key}{where}: {_one_line(inner)}, got {_show(value)}"


def _class_path_error(key: str, path: str, bases: list[str], problem: str | None = None) -> str:
    """``key`` names a class that does not import, is unknown by its short name, or is not a subclass of ``bases``."""
    expected = " or ".join(_public_name(base) for base in bases)
    if problem is None:
        try:
            _import(path)
            problem = "is not one"
        except Exception as err:  # an unknown short name, or the module / attribute is missing
            known = sorted({cls.__name__ for base in bases for cls in _subclasses(base)})
            if "." not in path:
                problem = f"is no known class{suggest(path, known)}; give its full import path"
            else:
                problem = f"does not import ({type(err).__name__}: {err})"
    return f"{key}: expected the class_path of a {expected} subclass; {path} {problem}, got {_show(path)}"


def _block(body: str, indent: int, start: int) -> str:
    """The lines of ``body`` after ``start`` that are more indented than ``indent`` (one item of a dump)."""
    lines = []
    for line in body[start:].split("\n")[1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        lines.append(line)
    return "\n".join(lines)


def _strip_got_value(text: str) -> str:
    """Drop jsonargparse's trailing ``. Got value: Namespace(...)`` after a nested parser's message."""
    return re.sub(r"\. Got value: Namespace\(.*$", "", text, flags=re.S)


# ----------------------------------------------------------------------------------------------- types and values


def _describe(types: str) -> str:
    """``"a float or null"`` for a jsonargparse type text such as ``[<class 'float'>, <class 'NoneType'>]``."""
    text = types.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    literals, parts = [], []
    for part in _split_top(text):
        if match := re.fullmatch(r"typing\.Literal\[(.*)\]", part, re.S):
            literals += _split_top(match[1])
        else:
            parts.append(_describe_one(part))
    if literals:
        parts.insert(0, "one of " + ", ".join(dict.fromkeys(literals)))
    parts = list(dict.fromkeys(p for p in parts if p))
    return " or ".join(parts) if parts else types


def _describe_one(text: str) -> str:
    if match := re.fullmatch(r"<class '([\w.]+)'>", text):
        name = match[1].rsplit(".", 1)[-1]
        return _PLAIN_TYPES.get(name, f"a {match[1]}")
    if match := re.fullmatch(r"typing\.Literal\[(.*)\]", text, re.S):
        return "one of " + ", ".join(_split_top(match[1]))
    if match := re.fullmatch(r"(?:list|typing\.List)\[(.*)\]", text):
        inner = _describe_one(match[1]).removeprefix("a ").removeprefix("an ")
        return f"a list of {inner}s" if " " not in inner else f"a list (items: {inner})"
    return _PLAIN_TYPES.get(text, text)


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for index, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _show(value: str | None) -> str:
    """A value as the user wrote it: numbers, booleans and null bare, other text quoted, long values cut."""
    text = "" if value is None else str(value).strip()
    if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|true|false|null|True|False|None|inf|nan", text):
        shown = text
    elif text[:1] in "[{'\"" and text:
        shown = text
    else:
        shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _unquote(text: str) -> str:
    text = text.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" else text


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ----------------------------------------------------------------------------------------------- classes


def _class_names(subtypes: str) -> list[str]:
    """Classes a ``class_path`` may name, from a union's subtypes (``Callable[..., X]`` -> X; no builtins, ABCs)."""
    names = [name for name in _DOTTED_CLASS.findall(subtypes) if not name.startswith(("collections.", "typing."))]
    return list(dict.fromkeys(names))


def _import(path: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ImportError(f"{path!r} is not an import path")
    return getattr(importlib.import_module(module_name), attr)


def _public_name(path: str) -> str:
    """The shortest import path of the class ``path`` names (``lit_entropy.rollout.RolloutEngine``)."""
    module, _, name = path.rpartition(".")
    try:
        target = _import(path)
    except Exception:  # the name came from jsonargparse's text; show it as given
        return path
    parts = module.split(".")
    for end in range(1, len(parts)):
        try:
            if getattr(importlib.import_module(".".join(parts[:end])), name, None) is target:
                return f"{'.'.join(parts[:end])}.{name}"
        except Exception:  # a package that fails to import: try a longer path
            continue
    return path


def _subclasses(base: str) -> list[type]:
    try:
        root = _import(base)
    except Exception:  # the base itself came from jsonargparse's text; nothing to suggest without it
        return []
    seen, stack = [], [root]
    while stack:
        for cls in stack.pop().__subclasses__():
            if cls not in seen:
                seen.append(cls)
                stack.append(cls)
    return [cls for cls in seen if not cls.__name__.startswith("_")]


def _is_settings_group(class_path: str) -> bool:
    try:
        return dataclasses.is_dataclass(_import(class_path))
    except Exception:  # not importable: not one of the settings dataclasses
        return False


def _init_arguments(class_path: str) -> list[str]:
    try:
        signature = inspect.signature(_import(class_path))
    except Exception:  # unknown class or no signature: no suggestion
        return []
    return [name for name in signature.parameters if name not in ("self", "args", "kwargs")]


def _key_for_subtypes(parser: Any, subtypes: str) -> str | None:
    """The setting whose type is the union jsonargparse listed as ``subtypes``."""
    for setting in parser_settings(parser) if parser is not None else []:
        hint = setting.typehint
        if hint is not None and not setting.dest.endswith(".help") and str(list(typing.get_args(hint))) == subtypes:
            return setting.dest
    return None
