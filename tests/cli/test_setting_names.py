"""Every dotted setting named in the package's error and warning messages exists today.

An old key in a message sends the user to a setting that is refused; this scan finds one the moment a
setting is renamed without its messages. README and docs/ are scanned by tests/test_docs.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import lit_entropy

ROOT = Path(lit_entropy.__file__).parents[1]
PACKAGE = ROOT / "lit_entropy"
KEY = re.compile(r"(?<![\w./])((?:model|data|trainer)(?:\.[a-z_][a-z0-9_]*)+)(?![\w(])")
MESSAGE_CALLS = {"warn", "rank_zero_warn", "rank_zero_info", "SettingsError"}


def _exists(key: str, keys: set[str], class_paths: set[str]) -> bool:
    return key in keys or any(key.startswith(f"{prefix}.") for prefix in class_paths)


def _message_strings(tree: ast.Module) -> list[tuple[int, str]]:
    """String constants (f-string parts included) inside ``raise`` statements and warning / info calls."""
    out = []
    for node in ast.walk(tree):
        called = (
            isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in MESSAGE_CALLS
        )
        if isinstance(node, ast.Raise) or called:
            out += [
                (sub.lineno, sub.value)
                for sub in ast.walk(node)
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
            ]
    return out


def test_every_setting_named_in_a_message_exists(accepted_settings):
    keys, class_paths = accepted_settings
    stale = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _message_strings(ast.parse(path.read_text(), str(path))):
            stale += [
                f"{path.relative_to(ROOT)}:{line}: {key}"
                for key in KEY.findall(text)
                if not _exists(key, keys, class_paths)
            ]
    assert not stale, "messages name settings that do not exist:\n" + "\n".join(stale)


def test_the_scan_finds_a_stale_name(accepted_settings):
    keys, class_paths = accepted_settings
    tree = ast.parse("raise ValueError(f'set model.update.fuse_old_logprob_pass={x} or model.optim.lr')")
    found = [key for _, text in _message_strings(tree) for key in KEY.findall(text)]
    assert found == ["model.update.fuse_old_logprob_pass", "model.optim.lr"]
    assert [key for key in found if not _exists(key, keys, class_paths)] == ["model.update.fuse_old_logprob_pass"]
