"""The policy-loss and advantage-estimator registries: the generic Registry, the built-in entries against
float64 loops written from their formulas, and the signature every registered function must have."""

from __future__ import annotations

import inspect
import math
import statistics
import sys
import textwrap

import pytest
import torch

import lit_entropy.functional as F
from lit_entropy.functional import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
    UnknownNameError,
    default_loss_agg_mode,
    estimator_needs_values,
    outcome_token_rewards,
    policy_loss_attribute,
    register_advantage_estimator,
    register_policy_loss,
)
from lit_entropy.functional.registry import ExpectedCall, is_import_path

POLICY_LOSS_KEYWORDS = (
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "loss_agg_mode",
    "normalizer",
    "loss_scale_factor",
)

# ---------------------------------------------------------------- the generic registry


def test_registry_registers_in_order_and_returns_the_function_unchanged():
    registry = Registry("widget")

    def first():
        return 1

    assert registry.register("a")(first) is first
    registry.register("b", colour="red")(lambda: 2)
    assert registry.names() == ("a", "b")
    assert list(registry) == ["a", "b"] and len(registry) == 2 and "a" in registry and "c" not in registry
    assert registry["a"]() == 1 and registry["b"]() == 2
    assert registry.attributes("b") == {"colour": "red"} and registry.attributes("a") == {}
    assert registry.unregister("a") is first
    assert registry.names() == ("b",)


def test_registry_refuses_duplicates_and_bad_names():
    registry = Registry("widget")
    registry.register("a")(print)
    with pytest.raises(ValueError, match=r"widget named 'a' is already registered .*builtins.print"):
        registry.register("a")
    for bad in ("", " a", 3, None):
        with pytest.raises(ValueError, match="non-empty string"):
            registry.register(bad)
    with pytest.raises(TypeError, match="only a callable"):
        registry.register("c")(42)
    assert registry.names() == ("a",)


def test_unknown_names_are_key_and_value_errors_listing_the_registered_names():
    registry = Registry("widget")
    registry.register("a")(print)
    registry.register("b")(print)
    with pytest.raises(KeyError) as lookup:
        registry["zz"]
    assert str(lookup.value) == (
        "no widget is registered as 'zz'; registered: ('a', 'b'), or give an import path 'pkg.module:function' "
        "(add one with @lit_entropy.functional.register_widget(name))"
    )
    with pytest.raises(ValueError) as setting:
        registry.check("model.thing", "zz")
    assert isinstance(setting.value, UnknownNameError)
    assert str(setting.value).startswith(
        "model.thing must be a registered widget, one of ('a', 'b'), or an import path 'pkg.module:function', got 'zz'"
    )
    assert registry.check("model.thing", "b") == "b"
    with pytest.raises(UnknownNameError):
        registry.check("model.thing", 3)
    with pytest.raises(UnknownNameError):
        registry.unregister("zz")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write ``<name>.py`` into a temporary directory on ``sys.path``; forget the module and its import paths after."""
    written: list[str] = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in written:
        sys.modules.pop(name, None)
        for registry in (POLICY_LOSSES, ADVANTAGE_ESTIMATORS):
            for path in [p for p in registry._imported if p.startswith(f"{name}:")]:
                registry.unregister(path)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("my_losses:unclipped", True),
        ("pkg.sub.module:Class.method", True),
        ("ppo", False),
        (
            "my_losses.unclipped",
            False,
        ),  # a dotted name is not an import path here: the colon says where the module ends
        ("my losses:f", False),
        (":f", False),
        ("m:", False),
        ("a:b:c", False),
        (3, False),
    ],
)
def test_what_reads_as_an_import_path(value, expected):
    assert is_import_path(value) is expected


def test_an_import_path_is_imported_once_checked_and_then_works_as_a_name(user_module):
    module = user_module(
        "registry_user_widgets",
        """
        CALLS = []

        def widget(a, *, b, **extra):
            CALLS.append((a, b))
            return a + b
        """,
    )
    registry = Registry("widget", ExpectedCall(positional=("a",), keywords=("b", "c")))
    registry.register("builtin")(lambda a, *, b, c: a)
    path = f"{module}:widget"
    assert path not in registry
    assert registry.check("model.widget", path) == path
    assert path in registry and registry.names() == ("builtin",)  # listed names stay the registered ones
    assert registry[path](1, b=2, c=3) == 3
    assert sys.modules[module].CALLS == [(1, 2)]
    assert registry.attributes(path) == {}
    registry.unregister(path)
    assert path not in registry


def test_an_import_path_that_cannot_take_the_call_is_refused_in_one_line(user_module):
    module = user_module(
        "registry_user_bad_losses",
        """
        def no_mask(logprobs, old_logprobs, advantages, **extra):
            return logprobs.sum(), None

        def strict(logprobs, old_logprobs, advantages, mask, *, loss_agg_mode):
            return logprobs.sum(), None

        NOT_A_FUNCTION = 3
        """,
    )
    call = POLICY_LOSSES.call.describe()
    with pytest.raises(ValueError) as too_many:
        POLICY_LOSSES.check("model.loss.policy_loss", f"{module}:no_mask")
    assert str(too_many.value) == (
        f"model.loss.policy_loss='{module}:no_mask' cannot take the policy loss call {call}: too many positional "
        "arguments"
    )
    with pytest.raises(ValueError) as unexpected:
        POLICY_LOSSES.check("model.loss.policy_loss", f"{module}:strict")
    assert str(unexpected.value).endswith(f"{call}: got an unexpected keyword argument 'clip_ratio_low'")
    with pytest.raises(ValueError, match=rf"='{module}:NOT_A_FUNCTION' must name a function, got int 3$"):
        POLICY_LOSSES.check("model.loss.policy_loss", f"{module}:NOT_A_FUNCTION")
    with pytest.raises(ValueError, match=r"^model.loss.policy_loss: cannot be imported \(AttributeError: .*'missing'"):
        POLICY_LOSSES.check("model.loss.policy_loss", f"{module}:missing")
    assert "\n" not in str(too_many.value) and f"{module}:strict" not in POLICY_LOSSES


def test_an_import_path_carries_the_attributes_its_function_is_registered_with(user_module):
    module = user_module(
        "registry_user_registered",
        """
        from lit_entropy.functional import ppo_policy_loss, register_advantage_estimator, register_policy_loss

        @register_policy_loss("registry_user_seq_loss", sequence_advantages=True, loss_agg_mode="seq-mean-token-sum")
        def seq_loss(logprobs, old_logprobs, advantages, mask, **options):
            return ppo_policy_loss(logprobs, old_logprobs, advantages, mask, **options)

        @register_advantage_estimator("registry_user_critic", needs_values=True)
        def critic(token_rewards, mask, *, group_size, values=None, scale="group"):
            return token_rewards, values
        """,
    )
    try:
        path = f"{module}:seq_loss"
        POLICY_LOSSES.check("model.loss.policy_loss", path)
        assert default_loss_agg_mode(path) == "seq-mean-token-sum"
        assert policy_loss_attribute(path, "sequence_advantages")
        assert "registry_user_seq_loss" in POLICY_LOSSES.names()  # importing the module registered its name too
        # A critic's estimator runs under PPO, whose options it must take: this one names none of them.
        with pytest.raises(ValueError) as refused:
            ADVANTAGE_ESTIMATORS.check("model.advantages.estimator", f"{module}:critic")
        assert str(refused.value).endswith(
            "(token_rewards, mask, *, group_size, values, scale, gamma, lam, whiten_advantages, **extra): got an "
            "unexpected keyword argument 'gamma'"
        )
    finally:
        POLICY_LOSSES.unregister("registry_user_seq_loss")
        ADVANTAGE_ESTIMATORS.unregister("registry_user_critic")


def test_a_lookup_imports_a_path_the_settings_checked_in_another_process(user_module):
    module = user_module("registry_user_lazy", "def estimator(token_rewards, mask, **extra):\n    return mask, None\n")
    path = f"{module}:estimator"
    assert path not in ADVANTAGE_ESTIMATORS
    assert ADVANTAGE_ESTIMATORS[path] is sys.modules[module].estimator
    assert ADVANTAGE_ESTIMATORS.attributes(path) == {}


def test_the_registries_and_decorators_are_exported():
    for name in (
        "ADVANTAGE_ESTIMATORS",
        "POLICY_LOSSES",
        "register_policy_loss",
        "register_advantage_estimator",
        "outcome_token_rewards",
    ):
        assert name in F.__all__
    assert POLICY_LOSSES.names()[0] == "ppo"
    assert {"grpo", "gae"} <= set(ADVANTAGE_ESTIMATORS.names())
    assert estimator_needs_values("gae") and not estimator_needs_values("grpo")


def test_decorators_register_in_the_shared_registries():
    @register_policy_loss("test_registry_loss")
    def loss(logprobs, old_logprobs, advantages, mask, **kwargs):
        return logprobs.sum(), None

    @register_advantage_estimator("test_registry_estimator", needs_values=True)
    def estimator(token_rewards, mask, *, group_size, values=None, **extra):
        return token_rewards, values

    try:
        assert POLICY_LOSSES["test_registry_loss"] is loss
        assert ADVANTAGE_ESTIMATORS["test_registry_estimator"] is estimator
        assert estimator_needs_values("test_registry_estimator")
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("test_registry_loss")
        with pytest.raises(TypeError, match="needs_values must be a bool"):
            register_advantage_estimator("other", needs_values="yes")
    finally:
        POLICY_LOSSES.unregister("test_registry_loss")
        ADVANTAGE_ESTIMATORS.unregister("test_registry_estimator")
    assert "test_registry_loss" not in POLICY_LOSSES


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_registered_policy_loss_has_the_common_signature(name):
    params = inspect.signature(POLICY_LOSSES[name]).parameters
    positional = [p.name for p in params.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == ["logprobs", "old_logprobs", "advantages", "mask"]
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in POLICY_LOSS_KEYWORDS)
    assert any(p.kind is p.VAR_KEYWORD for p in params.values())


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_every_registered_estimator_has_the_common_signature(name):
    params = inspect.signature(ADVANTAGE_ESTIMATORS[name]).parameters
    positional = [p.name for p in params.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == ["token_rewards", "mask"]
    assert params["group_size"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["values"].default is None
    assert any(p.kind is p.VAR_KEYWORD for p in params.values())


# ---------------------------------------------------------------- outcome token rewards


def test_outcome_token_rewards_put_each_reward_at_the_last_valid_token():
    mask = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 0]], dtype=torch.bool
    )
    rewards = torch.tensor([0.5, -1.0, 2.0, 3.0, 7.0])
    expected = torch.zeros(5, 5)
    for row, last in enumerate([2, 4, 0, 4, 2]):  # row 3 has no valid token: position T - 1
        expected[row, last] = rewards[row]
    got = outcome_token_rewards(rewards, mask)
    assert torch.equal(got, expected) and got.dtype == rewards.dtype
    with pytest.raises(ValueError, match=r"must be \[N\]"):
        outcome_token_rewards(rewards[:4], mask)


# ---------------------------------------------------------------- built-in estimators vs loops


def _random_batch(seed: int, n: int, t: int):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = torch.randint(0, 3, (n,), generator=g).double()
    return rewards, mask, g


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("group_size", [2, 4])
def test_grpo_estimator_matches_a_loop_and_is_zero_at_padding(scale, group_size):
    rewards, mask, _ = _random_batch(group_size, 4 * group_size, 6)
    rewards[:group_size] = 1.0  # an all-equal group
    r, eps = rewards.tolist(), 1e-6
    expected_seq = []
    for i in range(0, len(r), group_size):
        grp = r[i : i + group_size]
        for x in grp:
            if max(grp) == min(grp):
                expected_seq.append(0.0)
            elif scale == "group":
                expected_seq.append((x - statistics.fmean(grp)) / (statistics.stdev(grp) + eps))
            elif scale == "batch":
                expected_seq.append((x - statistics.fmean(grp)) / (statistics.stdev(r) + eps))
            else:
                expected_seq.append(x - statistics.fmean(grp))
    expected = [[expected_seq[i] if mask[i, j] else 0.0 for j in range(6)] for i in range(len(r))]
    advantages, returns = ADVANTAGE_ESTIMATORS["grpo"](
        outcome_token_rewards(rewards, mask), mask, group_size=group_size, scale=scale, gamma=0.5
    )
    assert returns is None
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def _loop_gae(rewards, values, mask, gamma, lam):
    """Textbook GAE over each row's valid tokens (right-padded rows), in Python floats."""
    out_adv, out_ret = [], []
    for r_row, v_row, m_row in zip(rewards.tolist(), values.tolist(), mask.tolist(), strict=True):
        idx = [j for j, m in enumerate(m_row) if m]
        adv = [0.0] * len(m_row)
        running = 0.0
        for k in reversed(range(len(idx))):
            j = idx[k]
            next_v = v_row[idx[k + 1]] if k + 1 < len(idx) else 0.0
            running = r_row[j] + gamma * next_v - v_row[j] + gamma * lam * running
            adv[j] = running
        out_adv.append(adv)
        out_ret.append([adv[j] + v_row[j] if m_row[j] else 0.0 for j in range(len(m_row))])
    return out_adv, out_ret


def _loop_whiten(adv, mask):
    valid = [a for row, m_row in zip(adv, mask.tolist(), strict=True) for a, m in zip(row, m_row, strict=True) if m]
    mean, var = statistics.fmean(valid), statistics.variance(valid)
    return [
        [(a - mean) / math.sqrt(var + 1e-8) if m else 0.0 for a, m in zip(row, m_row, strict=True)]
        for row, m_row in zip(adv, mask.tolist(), strict=True)
    ]


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)])
@pytest.mark.parametrize("whiten_advantages", [True, False])
def test_gae_estimator_matches_a_loop(gamma, lam, whiten_advantages):
    rewards, mask, g = _random_batch(7, 6, 5)
    values = torch.randn(6, 5, generator=g, dtype=torch.float64)
    token_rewards = outcome_token_rewards(rewards, mask)
    adv, ret = ADVANTAGE_ESTIMATORS["gae"](
        token_rewards,
        mask,
        group_size=2,
        values=values,
        gamma=gamma,
        lam=lam,
        whiten_advantages=whiten_advantages,
        scale="group",
    )
    expected_adv, expected_ret = _loop_gae(token_rewards, values, mask, gamma, lam)
    if whiten_advantages:
        expected_adv = _loop_whiten(expected_adv, mask)
    torch.testing.assert_close(adv, torch.tensor(expected_adv, dtype=torch.float64), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ret, torch.tensor(expected_ret, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_estimators_refuse_bad_inputs():
    rewards, mask, _ = _random_batch(1, 4, 3)
    token_rewards = outcome_token_rewards(rewards, mask)
    with pytest.raises(ValueError, match="needs the critic's values"):
        ADVANTAGE_ESTIMATORS["gae"](token_rewards, mask, group_size=2)
    with pytest.raises(ValueError, match="must share one"):
        ADVANTAGE_ESTIMATORS["grpo"](token_rewards[:, :2], mask, group_size=2)
    with pytest.raises(ValueError, match="scale must be one of"):
        ADVANTAGE_ESTIMATORS["grpo"](token_rewards, mask, group_size=2, scale="rank")


# ---------------------------------------------------------------- the registered ppo loss


def test_ppo_loss_matches_the_clipped_surrogate_and_ignores_extras():
    g = torch.Generator().manual_seed(3)
    old = torch.randn(3, 4, generator=g, dtype=torch.float64)
    logprobs = (old + 0.4 * torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    loss, stats = POLICY_LOSSES["ppo"](
        logprobs,
        old,
        adv,
        mask,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        loss_agg_mode="token-mean",
        normalizer=None,
        loss_scale_factor=None,
        response_mask=torch.ones(3, 4, dtype=torch.bool),
    )
    per_token, clipped = [], 0
    for i in range(3):
        for j in range(4):
            if not mask[i, j]:
                continue
            r, a = math.exp(float(logprobs[i, j].detach() - old[i, j])), float(adv[i, j])
            value = max(-a * r, -a * min(max(r, 0.8), 1.28))
            per_token.append(min(value, -a * 3.0) if a < 0 else value)
            clipped += (r < 0.8 and a < 0) or (r > 1.28 and a > 0)
    assert float(loss.detach()) == pytest.approx(statistics.fmean(per_token), rel=1e-12)
    assert float(stats.clip_frac) == pytest.approx(clipped / len(per_token), rel=1e-12)
    loss.backward()
    assert logprobs.grad[~mask].abs().max() == 0
