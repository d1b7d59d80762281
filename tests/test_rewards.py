"""Tests for lit_entropy.rewards: exact match, boxed math answers, and reward_fn resolution."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from lit_entropy.rewards import (
    RewardFunction,
    exact_match_reward,
    last_boxed_content,
    math_verify_reward,
    resolve_reward_fn,
)


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("68", "68", 1.0),
        ("  68  ", "68", 1.0),
        ("68\n12+3=15", "68", 1.0),  # only the first line counts
        ("\n68\n", " 68 ", 1.0),  # surrounding whitespace goes before the cut
        ("68 ", "68\n", 1.0),
        ("6 8", "68", 0.0),
        ("680", "68", 0.0),
        ("-4", "4", 0.0),
        ("", "68", 0.0),
        ("foo\n68", "68", 0.0),
    ],
)
def test_exact_match_reward_single(completion: str, answer: str, expected: float) -> None:
    assert exact_match_reward([completion], [answer]) == [expected]


def test_exact_match_reward_batched_matches_loop() -> None:
    completions = ["1", "2\n", " 3", "4x", "5\n5"]
    answers = ["1", "2", "3", "4", "6"]
    assert exact_match_reward(completions, answers) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert exact_match_reward([], []) == []


def test_exact_match_reward_length_mismatch() -> None:
    with pytest.raises(ValueError, match=r"len\(completions\)=2.*len\(answers\)=1"):
        exact_match_reward(["1", "2"], ["1"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"The answer is \boxed{34}.", "34"),
        (r"\boxed{1} no wait \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\sqrt{\frac{a}{b^{2}}}} done", r"\sqrt{\frac{a}{b^{2}}}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are not structure
        (r"\fbox{7}", "7"),
        (r"\boxed{3} and then \boxed{\frac{1}{", None),  # the last box is truncated
        ("no box here", None),
        (r"\boxed{}", ""),
    ],
)
def test_last_boxed_content(text: str, expected: str | None) -> None:
    assert last_boxed_content(text) == expected


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (r"So the result is $\boxed{\frac{1}{2}}$.", "0.5", 1.0),
        (r"\boxed{\frac{1}{2}}", "1/2", 1.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\dfrac{14}{3}}", r"\frac{14}{3}", 1.0),
        (r"\boxed{\sqrt{\frac{1}{4}}}", "1/2", 1.0),  # nested braces
        (r"\boxed{34}", "34", 1.0),
        (r"\boxed{34}", "$34$", 1.0),  # gold wrapped in $...$
        (r"\boxed{34}", r"\boxed{34}", 1.0),  # gold already boxed
        (r"first \boxed{12}, finally \boxed{34}", "34", 1.0),  # the LAST box counts
        (r"first \boxed{34}, finally \boxed{12}", "34", 0.0),
        (r"\boxed{[0, 1)}", "[0,1)", 1.0),
        (r"\boxed{x^2+1}", "1+x^2", 1.0),
        (r"\boxed{35}", "34", 0.0),  # wrong
        (r"\boxed{\frac{1}{3}}", "0.5", 0.0),
        ("The answer is 34.", "34", 0.0),  # no box
        (r"\boxed{34", "34", 0.0),  # unclosed box
        (r"\boxed{}", "34", 0.0),
        (r"\boxed{\frac{(}{}", "34", 0.0),  # garbage inside the box
        ("Step 1 ...\nAnswer: 34", "34", 1.0),  # DAPO-Math-17k's "Answer:" line
        ("Answer: 12\nno wait\nAnswer: $\\frac{1}{2}$", "0.5", 1.0),  # the last Answer: line counts
        ("Answer: 35", "34", 0.0),
        (r"Answer: 12 but \boxed{34}", "34", 1.0),  # a box takes precedence
        ("Answer:", "34", 0.0),
    ],
)
def test_math_verify_reward_single(completion: str, answer: str, expected: float) -> None:
    assert math_verify_reward([completion], [answer]) == [expected]


def test_math_verify_reward_batch_with_repeated_answers() -> None:
    # A GRPO group: four completions of one prompt, then two of another.
    completions = [r"\boxed{2}", r"\boxed{3}", r"\boxed{2.0}", "2", r"\boxed{\pi}", r"\boxed{3.14}"]
    answers = ["2", "2", "2", "2", r"\pi", r"\pi"]
    assert math_verify_reward(completions, answers) == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_math_verify_reward_outside_main_thread() -> None:
    # math_verify's signal.alarm timeouts raise outside the main thread; the reward must still work there.
    results: list[list[float]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(math_verify_reward([r"\boxed{\frac{1}{2}}", r"\boxed{3}"], ["0.5", "4"]))
        except BaseException as err:  # reported to the main thread by the assert below
            errors.append(err)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert not errors and results == [[1.0, 0.0]]


def test_math_verify_reward_length_mismatch() -> None:
    with pytest.raises(ValueError, match=r"len\(completions\)=1.*len\(answers\)=0"):
        math_verify_reward([r"\boxed{1}"], [])


def test_resolve_builtin_names_and_callables() -> None:
    assert resolve_reward_fn("exact_match") is exact_match_reward
    assert resolve_reward_fn("math_verify") is math_verify_reward

    def custom(completions: list[str], answers: list[str]) -> list[float]:
        return [0.5] * len(completions)

    assert resolve_reward_fn(custom) is custom
    assert isinstance(exact_match_reward, RewardFunction)


_USER_MODULE = """
def length_reward(completions, answers):
    return [float(len(c)) for c in completions]


class Scaled:
    def __init__(self):
        self.scale = 2.0

    def __call__(self, completions, answers):
        return [self.scale * (c == a) for c, a in zip(completions, answers)]


class Namespace:
    @staticmethod
    def nested(completions, answers):
        return [7.0 for _ in completions]


NOT_CALLABLE = 3
"""


@pytest.fixture
def user_rewards(tmp_path, monkeypatch) -> str:
    package = tmp_path / "my_rewards_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scoring.py").write_text(_USER_MODULE)
    (package / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_pkg.scoring"


def test_resolve_import_paths(user_rewards: str) -> None:
    fn = resolve_reward_fn(f"{user_rewards}:length_reward")
    assert fn(["ab", "abcd"], ["x", "y"]) == [2.0, 4.0]
    fn = resolve_reward_fn(f"{user_rewards}.length_reward")
    assert fn(["abc"], ["x"]) == [3.0]
    scaled = resolve_reward_fn(f"{user_rewards}:Scaled")  # a class is instantiated
    assert scaled(["1", "2"], ["1", "3"]) == [2.0, 0.0]
    nested = resolve_reward_fn(f"{user_rewards}:Namespace.nested")
    assert nested(["a", "b"], ["a", "b"]) == [7.0, 7.0]


@pytest.mark.parametrize(
    ("suffix", "match"),
    [
        (
            ":missing_fn",
            r"model.reward.fn: cannot be imported \(AttributeError.*got 'my_rewards_pkg\.scoring:missing_fn'",
        ),
        (
            ".missing_fn",
            r"model.reward.fn: cannot be imported \(AttributeError.*got 'my_rewards_pkg\.scoring\.missing_fn'",
        ),
        (
            ":NOT_CALLABLE",
            r"model.reward.fn: resolves to a int, which is not callable, got 'my_rewards_pkg\.scoring:NOT_CALLABLE'",
        ),
    ],
)
def test_resolve_failures_in_module(user_rewards: str, suffix: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_reward_fn(user_rewards + suffix)


def test_resolve_failures(user_rewards: str) -> None:
    match = (
        r"model.reward.fn: no module named 'no_such_pkg_xyz\.mod', neither on sys.path nor in the working .*PYTHONPATH"
    )
    with pytest.raises(ValueError, match=match):
        resolve_reward_fn("no_such_pkg_xyz.mod:fn")
    with pytest.raises(
        ValueError, match=r"model.reward.fn: cannot be imported \(.*boom at import.*got 'my_rewards_pkg\.broken:fn'"
    ):
        resolve_reward_fn("my_rewards_pkg.broken:fn")
    with pytest.raises(
        ValueError,
        match=r"model.reward.fn: expected a built-in reward \(exact_match, math_verify, word_problem\).*'exactmatch'",
    ):
        resolve_reward_fn("exactmatch")
    with pytest.raises(
        ValueError, match=r"model.reward.fn: expected a reward name, an import path or a callable, got ''"
    ):
        resolve_reward_fn("")
    with pytest.raises(ValueError, match=r"data.reward: expected a reward name, an import path or a callable, got 3"):
        resolve_reward_fn(3, setting="data.reward")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- a user's function that fails
def _picky_reward(completions: list[str], answers: list[str]) -> list[float]:
    """Fails on any completion holding 'x' (as a user's parser might)."""
    return [float(int(c.strip()) == int(a)) for c, a in zip(completions, answers, strict=True)]


def test_a_reward_function_that_raises_is_named_with_the_setting_and_the_failing_item() -> None:
    from lit_entropy.rewards import RewardFunctionError, compute_rewards

    completions = ["12", "13", "14", "1x5", "15", "16"]  # 3 prompts x 2 samples; item 3 = prompt 1, sample 1
    answers = ["12", "12", "15", "15", "16", "16"]
    with pytest.raises(RewardFunctionError) as info:
        compute_rewards(_picky_reward, completions, answers, fn_name="mypkg:picky", group_size=2)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("model.reward.fn: reward function 'mypkg:picky' raised ValueError: invalid literal")
    assert "on item 3 (prompt 1, sample 1: completion '1x5', answer '15')" in message
    assert message.endswith(", got 'mypkg:picky'")
    assert isinstance(info.value.__cause__, ValueError)  # the user's own exception stays attached
    ok = compute_rewards(_picky_reward, ["12", "13"], ["12", "12"], fn_name="mypkg:picky", group_size=2)
    assert ok.tolist() == [1.0, 0.0]


def test_a_batch_only_failure_and_a_bad_return_value_name_the_setting() -> None:
    from lit_entropy.rewards import RewardFunctionError, compute_rewards

    def needs_a_pair(completions: list[str], answers: list[str]) -> list[float]:
        if len(completions) < 2:
            return [0.0] * len(completions)
        raise RuntimeError("batch too large\nsecond line")

    with pytest.raises(
        RewardFunctionError,
        match=r"^data\.x: reward function 'f' raised RuntimeError: batch too large "
        r"second line on a batch of 2 completions \(no single completion fails alone\), got 'f'$",
    ):
        compute_rewards(needs_a_pair, ["a", "b"], ["a", "b"], fn_name="f", setting="data.x")
    with pytest.raises(RewardFunctionError, match=r"^model\.reward\.fn: reward function 'g': item 1 is nan"):
        compute_rewards(lambda c, a: [1.0, float("nan")], ["a", "b"], ["a", "b"], fn_name="g")


def _without_the_working_directory(monkeypatch, directory) -> None:
    """sys.path as the ``lit-entropy`` console script has it: no ``""`` / cwd entry (``python -m pytest`` adds one)."""
    here = os.path.realpath(directory)
    kept = [entry for entry in sys.path if os.path.realpath(entry or ".") != here and entry not in ("", ".")]
    monkeypatch.setattr(sys, "path", kept)


def test_a_reward_module_beside_the_data_is_found_from_the_working_directory(tmp_path, monkeypatch) -> None:
    """Issue 35 §4: ``model.reward.fn: my_rewards:score`` run from the directory holding my_rewards.py."""
    (tmp_path / "my_rewards_cwd.py").write_text(
        "def score(completions, answers):\n    return [1.0 for _ in completions]\n"
    )
    monkeypatch.chdir(tmp_path)
    _without_the_working_directory(monkeypatch, tmp_path)
    monkeypatch.delitem(sys.modules, "my_rewards_cwd", raising=False)
    fn = resolve_reward_fn("my_rewards_cwd:score")
    assert fn(["a", "b"], ["x", "y"]) == [1.0, 1.0]
    assert sys.path[0] == os.getcwd()  # in front, as python -m puts it
    sys.modules.pop("my_rewards_cwd", None)


def test_a_reward_module_found_nowhere_says_where_it_was_looked_for(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _without_the_working_directory(monkeypatch, tmp_path)
    with pytest.raises(ValueError) as info:
        resolve_reward_fn("my_rewards_nowhere:score")
    message = str(info.value)
    assert message == (
        f"model.reward.fn: no module named 'my_rewards_nowhere', neither on sys.path nor in the working directory "
        f"{os.getcwd()}; run lit-entropy from the directory that holds my_rewards_nowhere.py (or the package "
        "my_rewards_nowhere/), or add that directory to PYTHONPATH, got 'my_rewards_nowhere:score'"
    )
    # A module the reward module itself imports is named as it is (the user's module was found).
    (tmp_path / "needs_missing.py").write_text("import no_such_dependency_xyz\n\ndef score(c, a):\n    return []\n")
    with pytest.raises(ValueError, match=r"cannot be imported \(ModuleNotFoundError: No module named 'no_such_dep"):
        resolve_reward_fn("needs_missing:score")
    sys.modules.pop("needs_missing", None)
