"""README.md and docs/*.md name only settings, TensorBoard tags, paths and command options that exist.

Each check reads the Markdown as a user does: code spans (also across a line break and in tables), shell and
YAML blocks and links; Python blocks are code of their own (their tags and names belong to that example) and
are run by tests/test_readme_example.py and tests/step/test_registered_step.py instead. A failure names the
file, the line and the stale name.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```\n", re.M | re.S)
SPAN = re.compile(r"`([^`]+)`")
KEY = re.compile(r"(?<![\w./])((?:model|data|trainer)(?:\.[a-z_][a-z0-9_]*)+)(?![\w(])")
TAG = re.compile(r"(?<![\w./-])((?:train|val|test|perf|overview)/[\w@<>*./-]*[\w@>*])")
PATH = re.compile(r"(?<![\w./-])((?:configs|scripts|lit_entropy|tests|docs|\.ci)/[\w./-]*[\w])")
COMMAND = re.compile(r"(?:\blit-entropy|-m lit_entropy|\bpython -m (scripts(?:\.\w+)+))((?: +[^\s|;&>#]+)*)")
# What may precede a command on its line: an environment variable or a launcher.
LAUNCHER = re.compile(r"\s*(?:srun|torchrun|[A-Z_]+=)")
# Names in the troubleshooting table that are the mistakes it shows (and a file name).
NOT_SETTINGS = {"model.safetensors", "trainer.max_step", "model.sampling.temprature"}
LIT_ENTROPY_SUBCOMMANDS = ("fit", "validate", "test", "predict", "export")


@dataclass(frozen=True)
class Mention:
    """A name as the docs write it: where, and whether it sits in a code span / block or in prose."""

    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


def _blank(text: str, start: int, end: int) -> str:
    """``text`` with ``[start, end)`` replaced by spaces, newlines kept (so offsets and line numbers stay)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def split_markdown(path: Path) -> tuple[str, list[tuple[int, str, str]]]:
    """(the prose with every fenced block blanked out, [(first line, language, body) of each block])."""
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start(2)) + 1
        blocks.append((line, match.group(1), match.group(2)))
        text = _blank(text, match.start(), match.end())
    return text, blocks


def code_mentions(path: Path) -> list[Mention]:
    """Every code span of the prose (joined across a line break) and every line of a non-Python block."""
    prose, blocks = split_markdown(path)
    name = str(path.relative_to(ROOT))
    out = []
    for match in SPAN.finditer(prose):
        if "\n\n" in match.group(1):  # an unpaired backtick: never pair across paragraphs
            continue
        out.append(Mention(name, prose.count("\n", 0, match.start()) + 1, " ".join(match.group(1).split())))
    for first, language, body in blocks:
        if language == "python":
            continue
        command, start = "", None
        for number, line in enumerate(body.splitlines()):
            start = first + number if start is None else start
            if line.endswith("\\"):  # a shell line continued with a backslash is one command
                command += line[:-1] + " "
                continue
            out.append(Mention(name, start, command + line))
            command, start = "", None
    return out


def prose_lines(path: Path) -> list[Mention]:
    """Every line outside Python blocks (settings keys are also written outside code spans)."""
    prose, blocks = split_markdown(path)
    name = str(path.relative_to(ROOT))
    lines = prose.splitlines()
    for first, language, body in blocks:
        if language != "python":
            for number, line in enumerate(body.splitlines()):
                lines[first - 1 + number] = line
    return [Mention(name, number, line) for number, line in enumerate(lines, 1) if line.strip()]


# ------------------------------------------------------------------------------------------------ settings
def test_every_setting_named_in_the_docs_exists(accepted_settings):
    """Old names may appear where the docs say they are refused (each is in LEGACY_MODEL_KEYS)."""
    from lit_entropy.settings import LEGACY_MODEL_KEYS

    keys, class_paths = accepted_settings
    allowed = {f"model.{name}" for name in LEGACY_MODEL_KEYS} | NOT_SETTINGS

    def exists(key: str) -> bool:
        return key in keys or key in allowed or any(key.startswith(f"{prefix}.") for prefix in class_paths)

    stale = [
        f"{mention.file}:{mention.line}: {key}"
        for path in DOCS
        for mention in prose_lines(path)
        for key in KEY.findall(mention.text)
        if not exists(key)
    ]
    assert not stale, "README or docs/ name settings that do not exist:\n" + "\n".join(stale)


def test_the_settings_reference_is_generated_from_the_code():
    from _scripts import load_script

    reference = load_script("scripts.docs.settings_reference")
    assert reference.read_block() == reference.block(), (
        "docs/settings.md is stale: python -m scripts.docs.settings_reference --update"
    )


# ------------------------------------------------------------------------------------------------ tags
def _tag_pattern(tag: str) -> re.Pattern[str]:
    """A documented tag as a regex: ``@K`` / ``pass@k`` take any number, ``<name>`` one level, ``*`` the rest."""
    out = ""
    for part in re.split(r"(@K|pass@k|<[^>]+>|\*)", tag):
        if part == "@K":
            out += r"@(?:K|\d+)"
        elif part == "pass@k":
            out += r"pass@(?:k|\d+)"
        elif part.startswith("<"):
            out += r"[^/]+"
        elif part == "*":
            out += r".+"
        else:
            out += re.escape(part)
    return re.compile(out)


def documented_tags() -> list[str]:
    """The tags of docs/dashboard.md's table (``tests/reporting/test_dashboard.py`` checks them against runs)."""
    text = (ROOT / "docs" / "dashboard.md").read_text()
    section = text[text.index("\n## Tags\n") :]
    end = section.find("\n## ", 1)
    rows = section.splitlines() if end < 0 else section[:end].splitlines()
    return [re.match(r"\| `([^`]+)`", row).group(1) for row in rows if row.startswith("| `")]


def _is_documented(tag: str, documented: list[str]) -> bool:
    tag = re.sub(r"^test/", "val/", tag)  # validate / test log the val/ tags under test/
    if tag.endswith("/*"):
        return any(d.startswith(tag[:-1]) for d in documented)
    return any(_tag_pattern(d).fullmatch(tag) or _tag_pattern(tag).fullmatch(d) for d in documented)


def test_every_tag_named_in_the_docs_is_documented():
    documented = documented_tags()
    assert len(documented) > 40, "docs/dashboard.md's tag table was not found"
    stale = [
        f"{mention.file}:{mention.line}: {tag}"
        for path in DOCS
        for mention in code_mentions(path)
        for tag in TAG.findall(mention.text)
        if not _is_documented(tag, documented)
    ]
    assert not stale, (
        "README or docs/ name TensorBoard tags that docs/dashboard.md's table does not list:\n" + "\n".join(stale)
    )


def test_the_tag_check_finds_a_stale_tag():
    documented = documented_tags()
    assert _is_documented("val/avg@8", documented) and _is_documented("val/pass@4", documented)
    assert _is_documented("train/dynamics/predicted_a_pos_d_pos", documented)
    assert _is_documented("train/<tool>/frac", documented) and _is_documented("perf/*", documented)
    assert not _is_documented("train/skipped_updates", documented)
    assert not _is_documented("train/rollout_logprob_gap_mean", documented)


# ------------------------------------------------------------------------------------------------ paths
def test_every_path_named_in_the_docs_exists():
    stale = []
    for path in DOCS:
        for mention in code_mentions(path):
            for name in PATH.findall(mention.text):
                name = name.split("::")[0]
                if "<" not in name and not (ROOT / name).exists():
                    stale.append(f"{mention}: {name}")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if "://" in target or target.startswith("#"):
                    continue
                if not (path.parent / target.split("#")[0]).exists():
                    stale.append(f"{path.relative_to(ROOT)}:{number}: link {target}")
    assert not stale, "README or docs/ name files that do not exist:\n" + "\n".join(stale)


# ------------------------------------------------------------------------------------------------ commands
@pytest.fixture(scope="module")
def command_options() -> dict[str, set[str]]:
    """The options each ``lit-entropy`` subcommand accepts that are not dotted settings."""
    from lightning.pytorch import Trainer

    from lit_entropy.cli import cli_main
    from lit_entropy.cli import export as export_module

    parser = cli_main(["--trainer.logger=false"], run=False).parser
    common = {option for action in parser._actions for option in action.option_strings if "." not in option}
    out = {
        sub: common | {f"--{name}" for name in inspect.signature(getattr(Trainer, sub)).parameters}
        for sub in LIT_ENTROPY_SUBCOMMANDS
        if sub != "export"
    }
    out["export"] = set(re.findall(r'"(--\w+)"', inspect.getsource(export_module)))
    return out


def _script_source(module: str) -> str:
    """The source ``python -m <module>`` runs: a module file, or a package's ``__main__.py`` with the package's
    other modules (a study's ``__main__`` only calls the ``main`` of its ``run.py``), plus the study runner's shared
    options where it adds them (``runner.add_arguments``); "" if none."""
    path = ROOT.joinpath(*module.split("."))
    if path.with_suffix(".py").is_file():
        source = path.with_suffix(".py").read_text()
    elif (path / "__main__.py").is_file():
        source = "\n".join(file.read_text() for file in sorted(path.glob("*.py")))
    else:
        return ""
    if "runner.add_arguments(" in source:
        source += (ROOT / "scripts" / "studies" / "runner.py").read_text()
    return source


def _command_errors(mention: Mention, command_options: dict[str, set[str]]) -> list[str]:
    errors = []
    launched = LAUNCHER.match(mention.text)
    for match in COMMAND.finditer(mention.text):
        before = mention.text[: match.start()].rstrip()
        if before and not before.endswith("&&") and not launched:
            continue  # prose that names the command ("with lit-entropy set ...")
        script, words = match.group(1), match.group(2).split()
        if script:
            source = _script_source(script)
            if not source:
                errors.append(f"{mention}: {script} does not exist")
            errors += [
                f"{mention}: {script} has no option {word}"
                for word in words
                if word.startswith("--") and f'"{word.split("=")[0]}"' not in source
            ]
            continue
        if not words or words[0].startswith("-"):
            continue  # lit-entropy --help, --version
        if words[0] not in LIT_ENTROPY_SUBCOMMANDS:
            errors.append(f"{mention}: lit-entropy has no subcommand {words[0]}")
            continue
        allowed = command_options[words[0]]
        errors += [
            f"{mention}: lit-entropy {words[0]} has no option {word}"
            for word in words[1:]
            if word.startswith("--") and "." not in word and word.split("=")[0] not in allowed
        ]
    return errors


def test_every_command_in_the_docs_exists(command_options):
    stale = [
        error for path in DOCS for mention in code_mentions(path) for error in _command_errors(mention, command_options)
    ]
    assert not stale, "README or docs/ show commands that do not exist:\n" + "\n".join(stale)


def test_the_command_check_finds_a_stale_command(command_options):
    def errors(text: str) -> list[str]:
        return _command_errors(Mention("README.md", 1, text), command_options)

    assert errors("lit-entropy fit --config configs/grpo_tiny.yaml --ckpt_path x.ckpt --print_config") == []
    assert errors("lit-entropy export --ckpt_path x.ckpt --out d --overwrite") == []
    assert errors("python -m scripts.bench.step --realistic --rounds 2") == []
    assert len(errors("lit-entropy train --config x.yaml")) == 1
    assert len(errors("lit-entropy fit --ckpt x.ckpt")) == 1
    assert len(errors("python -m scripts.bench.step --no-such-flag")) == 1
    assert len(errors("python -m scripts.bench.no_such_script")) == 1
    assert len(errors("X=0 lit-entropy fitt")) == 1 and errors("with lit-entropy set the path") == []


# ------------------------------------------------------------------------------------------------ tables
def test_every_table_row_has_its_header_s_cells():
    """An unescaped ``|`` inside a code span splits a cell on GitHub (write ``\\|``)."""
    bad = []
    for path in DOCS:
        prose, _ = split_markdown(path)
        cells = None
        for number, line in enumerate(prose.splitlines(), 1):
            if not line.startswith("|"):
                cells = None
                continue
            count = len(re.findall(r"(?<!\\)\|", line))
            cells = count if cells is None else cells
            if count != cells:
                bad.append(f"{path.relative_to(ROOT)}:{number}: {count - 1} cells, the header has {cells - 1}")
    assert not bad, "table rows that do not match their header:\n" + "\n".join(bad)
