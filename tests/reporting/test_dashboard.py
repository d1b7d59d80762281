"""What a user sees in TensorBoard: the tag set is README's table, no silent constants, HPARAMS, aligned steps."""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_entropy.reporting.console import ConsoleMetrics
from lit_entropy.reporting.dashboard import (
    DashboardRun,
    StepReport,
    TagPlan,
    TrainDashboard,
    batch_statistics,
    samples_markdown,
)
from lit_entropy.reporting.evaluation import SampleEvaluator
from lit_entropy.reporting.hparams import callback_init_args, flatten_hparams
from lit_entropy.rollout import RolloutBatch

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def readme_tag_table() -> list[dict[str, str]]:
    """Rows of README's "Logged to TensorBoard" table: tag, condition (first code span of "When"), constant note."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Logged to TensorBoard") :]
    section = section[: section.index("\n## ")]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        tag = re.match(r"`([^`]+)`", cells[0]).group(1)
        kind = "text" if "(text)" in cells[0] else "histogram" if "(histogram)" in cells[0] else "scalar"
        condition = re.search(r"`([^`]+)`", cells[2]).group(1)
        rows.append({"tag": tag, "kind": kind, "when": condition, "constant": cells[3]})
    return rows


def expected_tags(conditions: set[str], k: int, pass_ks: list[int]) -> dict[str, dict[str, str]]:
    """README's tags for a run whose active conditions are ``conditions``, as event-file tag names."""
    out = {}
    for row in readme_tag_table():
        if row["when"] not in conditions:
            continue
        names = [row["tag"].replace("@K", f"@{k}")]
        if "pass@k" in row["tag"]:
            names = [row["tag"].replace("pass@k", f"pass@{kk}") for kk in pass_ks if kk > 1]
        if row["kind"] == "text":
            names = [f"{row['tag']}/text_summary"]
        out.update({name: row for name in names})
    return out


def _event_file(log_dir: Path) -> dict:
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})  # keep all
    events.Reload()
    tags = events.Tags()
    scalars = {t: [(e.step, e.value) for e in events.Scalars(t)] for t in tags["scalars"]}
    histograms = {t: [e.step for e in events.Histograms(t)] for t in tags["histograms"]}
    texts = {t: [e.step for e in events.Tensors(t)] for t in tags["tensors"]}
    plugin = plugin_event_accumulator.EventAccumulator(str(log_dir))
    plugin.Reload()
    content = plugin.PluginTagToContent("hparams").get("_hparams_/experiment")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content).experiment if content else None
    return {"scalars": scalars, "histograms": histograms, "texts": texts, "hparams": experiment}


@pytest.mark.parametrize(
    ("config", "conditions"),
    [
        ("grpo_tiny.yaml", {"always", "grouped", "samples"}),
        ("clip_b_tiny.yaml", {"always", "grouped", "samples", "mask callback", "entropy clipping"}),
    ],
)
def test_a_short_fit_logs_exactly_readme_tags(config, conditions, tmp_path, monkeypatch, capsys):
    from lit_entropy.cli import cli_main

    monkeypatch.chdir(tmp_path)
    short = [
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=4",
        "--trainer.val_check_interval=2",
        "--trainer.enable_progress_bar=false",
        "--data.num_train_examples=64",
        "--data.num_val_examples=16",
        "--data.val_batch_size=16",
        "--model.logging.log_samples_every_n_steps=2",
        "--model.logging.export_on_train_end=false",
    ]
    torch.set_num_threads(1)
    cli_main(["fit", "--config", str(CONFIGS / config), *short])
    log_dir = next((tmp_path / "runs").glob("*/version_0"))
    run = _event_file(log_dir)
    expected = expected_tags(conditions, 8, [1, 2, 4, 8])
    logged = set(run["scalars"]) | set(run["histograms"]) | set(run["texts"])
    assert logged == set(expected), (sorted(set(expected) - logged), sorted(logged - set(expected)))

    for tag, points in run["scalars"].items():
        if len({value for _, value in points}) == 1 and len(points) > 1:
            assert expected[tag]["constant"], f"{tag} is constant over the run ({points}) and README does not say why"

    train_steps = [step for step, _ in run["scalars"]["train/reward/mean"]]
    assert train_steps == [0, 1, 2, 3]
    # Samples and histograms every 2 batches, at the steps of those batches' scalars.
    assert run["histograms"]["train/entropy/tokens"] == [0, 2]
    assert run["texts"]["train/samples/text_summary"] == [0, 2]

    hparams = run["hparams"]
    assert hparams is not None, "no HPARAMS summary"
    assert [m.name.tag for m in hparams.metric_infos] == ["val/avg@8", "val/pass@2", "val/pass@4", "val/pass@8"]
    names = {h.name for h in hparams.hparam_infos}
    assert {"model/loss/clip_ratio_low", "model/sampling/num_samples", "data/batch_size"} <= names
    if "entropy clipping" in conditions:
        assert {"callbacks/EntropyDiscriminatorClipping/mu", "callbacks/EntropyDiscriminatorClipping/method"} <= names
    assert "hp_metric" not in run["scalars"]  # no placeholder metric (default_hp_metric: false)

    # stdout is captured (not a terminal): one line per logged step, TensorBoard's steps; a validation value only
    # on the step it was logged at (before training: 0; after 2 and 4 batches: 2 and 4, the last on its own line).
    val_steps = [step for step, _ in run["scalars"]["val/avg@8"]]
    assert val_steps == [0, 2, 4]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in lines] == ["step 0", "step 1", "step 2", "step 3", "step 4"]
    assert [i for i, line in enumerate(lines) if "val/avg@8" in line] == val_steps
    values = dict(run["scalars"]["val/avg@8"])
    for step in val_steps:
        assert f"val/avg@8 {values[step]:.3f}" in lines[step]
    assert all("reward" in line and "s/step" in line for line in lines[:4]) and "reward" not in lines[4]


def test_readme_table_covers_every_condition_once_and_names_are_unique():
    rows = readme_tag_table()
    tags = [row["tag"] for row in rows]
    assert len(tags) == len(set(tags))
    assert all(row["when"] for row in rows)


def _experience(rewards, lengths, width, eos_at_end, advantages, entropy, loss_mask=None):
    n = len(rewards)
    mask = torch.arange(width).expand(n, width) < torch.tensor(lengths).unsqueeze(-1)
    responses = torch.full((n, width), 5)
    for row, (length, eos) in enumerate(zip(lengths, eos_at_end, strict=True)):
        if eos:
            responses[row, length - 1] = 2
    sequences = torch.cat([torch.ones(n, 3, dtype=torch.long), responses], -1)
    rollout = RolloutBatch(sequences, torch.ones_like(sequences), mask)
    return SimpleNamespace(
        rollout=rollout,
        response_mask=mask,
        rewards=torch.tensor(rewards),
        advantages=advantages,
        entropy=entropy,
        loss_mask=mask if loss_mask is None else loss_mask,
    )


def test_batch_statistics_match_a_brute_force_reference():
    torch.manual_seed(0)
    rewards = [1.0, 0.0, 0.5, 0.5, 0.0, 1.0]  # groups of 2: (1, 0), (.5, .5) all equal, (0, 1)
    lengths, eos = [4, 2, 4, 3, 1, 4], [False, True, True, True, True, False]
    adv, ent = torch.randn(6, 4), torch.rand(6, 4)
    keep = torch.rand(6, 4) > 0.3
    exp = _experience(rewards, lengths, 4, eos, adv, ent, loss_mask=None)
    exp.loss_mask = exp.response_mask & keep
    out = batch_statistics(exp, 2, 4, [2], TagPlan(mask_providers=2))
    r = torch.tensor(rewards)
    assert out["train/reward/mean"] == pytest.approx(float(r.mean()))
    assert out["train/reward/std"] == pytest.approx(float(r.std()))
    assert (out["train/reward/min"], out["train/reward/max"]) == (0.0, 1.0)
    assert out["train/reward/frac_zero_std"] == pytest.approx(1 / 3)
    valid = [adv[i, j] for i in range(6) for j in range(lengths[i])]
    assert out["train/advantage/mean"] == pytest.approx(float(torch.stack(valid).mean()), rel=1e-6)
    assert out["train/advantage/std"] == pytest.approx(float(torch.stack(valid).std()), rel=1e-6)
    assert out["train/advantage/max"] == pytest.approx(float(max(valid)))
    assert out["train/length/mean"] == pytest.approx(sum(lengths) / 6)
    assert (out["train/length/min"], out["train/length/max"]) == (1.0, 4.0)
    # Length 4 = max_new_tokens without EOS: rows 0 and 5 (row 2 ended with its EOS at the limit).
    assert out["train/length/truncated_frac"] == pytest.approx(2 / 6)
    kept = [ent[i, j] for i in range(6) for j in range(lengths[i]) if keep[i, j]]
    masked = [ent[i, j] for i in range(6) for j in range(lengths[i]) if not keep[i, j]]
    assert out["train/entropy/kept"] == pytest.approx(float(torch.stack(kept).mean()), rel=1e-6)
    assert out["train/entropy/masked"] == pytest.approx(float(torch.stack(masked).mean()), rel=1e-6)
    assert out["train/mask/loss_token_frac"] == pytest.approx(len(kept) / sum(lengths))
    assert "train/entropy/kept" not in batch_statistics(exp, 2, 4, [2], TagPlan())


def test_tag_plan_decides_from_explicit_facts():
    from lit_entropy.rollout import HFRolloutEngine, RolloutEngine
    from lit_entropy.settings import OptimConfig

    class Syncing(HFRolloutEngine):
        def sync_weights(self, policy, step):  # an engine with its own copy of the weights
            pass

    facts = dict(optim=OptimConfig(), group_size=4, mask_providers=0, coefficient_providers=0)
    plain = TagPlan.decide(updates_per_batch=1, rollout_engine=HFRolloutEngine(), **facts)
    assert plain == TagPlan(off_policy=False, lr_changes=False, grouped=True, syncs_weights=False)
    assert Syncing.sync_weights is not RolloutEngine.sync_weights
    busy = TagPlan.decide(
        updates_per_batch=4, optim=OptimConfig(warmup_steps=2), group_size=1, mask_providers=2,
        coefficient_providers=1, rollout_engine=Syncing(),
    )  # fmt: skip
    assert busy == TagPlan(True, True, False, 2, True, True)
    cosine = {**facts, "optim": OptimConfig(lr_schedule="cosine")}
    assert TagPlan.decide(updates_per_batch=1, rollout_engine=HFRolloutEngine(), **cosine).lr_changes


def test_the_dashboard_logs_the_numbers_the_module_hands_it():
    """Everything logged comes from the DashboardRun / StepReport: lr, skipped updates, clip fractions, coefficients."""
    torch.manual_seed(1)
    exp = _experience([1.0, 0.0, 0.25, 1.0], [3, 2, 3, 1], 3, [True] * 4, torch.randn(4, 3), torch.rand(4, 3))
    exp.coefficients, exp.rollout_gap = {"entropy_coef": 0.125}, None
    logged = {}

    def log(name, value, **options):
        logged[name] = (float(value), options)

    plan = TagPlan(off_policy=True, lr_changes=True, grouped=True, coefficient_providers=True)
    run = DashboardRun(
        plan=plan, group_size=2, max_new_tokens=3, eos_token_ids=(2,), device=torch.device("cpu"), log=log
    )
    clip = {"low": torch.tensor(0.25), "high": torch.tensor(0.5), "total": torch.tensor(0.75)}
    terms = {"pg_loss": -0.5, "grad_norm": 2.0, "approx_kl": 0.01}
    report = StepReport(experience=exp, terms=terms, prompts=2, lr=3e-4, skipped_updates=1, clip=clip)
    TrainDashboard().log_step(run, report)
    assert logged["train/optim/lr"][0] == pytest.approx(3e-4)
    assert logged["train/optim/skipped_updates"][0] == 1.0
    assert logged["train/loss/entropy_coef"][0] == 0.125
    assert {k: logged[f"train/clip/{n}"][0] for n, k in (("ratio", "total"), ("low", "low"), ("high", "high"))} == {
        "total": 0.75, "low": 0.25, "high": 0.5,
    }  # fmt: skip
    assert logged["train/loss/policy"] == (-0.5, {"on_step": True, "batch_size": 2, "sync_dist": True})
    assert logged["train/clip/approx_kl"][0] == pytest.approx(0.01)
    assert logged["train/optim/grad_norm"][0] == 2.0
    valid = [exp.entropy[i, j] for i, n in enumerate([3, 2, 3, 1]) for j in range(n)]
    assert logged["train/entropy/mean"][0] == pytest.approx(float(torch.stack(valid).mean()), rel=1e-6)
    assert logged["train/reward/mean"] == (pytest.approx(2.25 / 4), {"on_step": True, "batch_size": 2})
    assert logged["train/reward/min"][0] == 0.0  # a reward of 0.25: min / max carry information
    assert "perf/time_sync_s" not in logged and "perf/peak_memory_mb" in logged
    quiet = {}
    off = DashboardRun(
        plan=TagPlan(), group_size=2, max_new_tokens=3, eos_token_ids=(2,), device=torch.device("cpu"),
        log=lambda name, value, **options: quiet.setdefault(name, value),
    )  # fmt: skip
    TrainDashboard().log_step(off, StepReport(experience=exp, terms={"grad_norm": 1.0}, prompts=2, lr=1.0))
    assert not {"train/optim/lr", "train/optim/skipped_updates", "train/clip/ratio", "train/loss/entropy_coef"} & set(
        quiet
    )


def test_samples_show_whole_groups_with_reward_and_advantage():
    table = samples_markdown(
        ["1+1=", "2+2=", "3+3="],
        ["2", "4", "6"],
        ["2", "3", "4", "4", "6", "7"],
        torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0]),
        torch.tensor([0.7, -0.7, 0.0, 0.0, 0.7, -0.7]),
        group_size=2,
        num_prompts=2,
    )
    rows = table.splitlines()[2:]
    assert len(rows) == 4  # every completion of the first two prompts
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [c[3] for c in cells] == ["2", "3", "4", "4"]
    assert [c[4] for c in cells] == ["1", "0", "1", "1"]
    assert [c[5] for c in cells] == ["+0.7", "-0.7", "+0", "+0"]
    assert cells[0][0] == "1+1=" and cells[1][0] == ""  # the prompt once per group


class _Recorder:
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.logged: dict[str, object] = {}

    def log(self, name, value, **kwargs) -> None:
        self.logged[name] = value


def test_per_class_avg_at_k_and_the_reward_mean_only_for_non_binary_rewards():
    evaluator = SampleEvaluator([1, 2], correct_threshold=1.0)
    evaluator.reset(["add", "sub"])
    rollout = RolloutBatch(torch.zeros(6, 3, dtype=torch.long), torch.ones(6, 3), torch.ones(6, 1, dtype=torch.bool))
    module = _Recorder()
    evaluator.update_and_log(
        module.log, "val", torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), rollout, 2, ["add", "sub", "add"]
    )
    evaluator.log_epoch_end(module.log, "val", module.device)
    assert module.logged["val/avg@2/add"] == pytest.approx((0.5 + 0.0) / 2)
    assert module.logged["val/avg@2/sub"] == pytest.approx(1.0)
    assert "val/reward/mean" not in module.logged and "val/pass@1" not in module.logged
    evaluator.reset(None)
    evaluator.update_and_log(module.log, "val", torch.tensor([0.5, 1.0]), rollout.select(slice(0, 2)), 2)
    evaluator.log_epoch_end(module.log, "val", module.device)
    assert float(module.logged["val/reward/mean"]) == pytest.approx(0.75)


def test_console_line_and_hparams_helpers():
    trainer = SimpleNamespace(
        callback_metrics={"train/reward/mean": torch.tensor(0.5), "train/entropy/mean": torch.tensor(0.25)},
        lightning_module=None,
    )
    console = ConsoleMetrics(stream=io.StringIO())
    assert console.line(trainer, 2) == "step 2 | reward 0.500 | entropy 0.250"
    assert flatten_hparams({"a": {"b": 1, "c": None, "d": [1, 2]}}) == {"a/b": 1, "a/c": "None", "a/d": "[1, 2]"}
    from lit_entropy.callbacks import EntropyDiscriminatorClipping

    args = callback_init_args(EntropyDiscriminatorClipping("clip_b", mu=1.5))
    assert args == {
        "method": "clip_b",
        "mu": 1.5,
        "max_frac": 1e-4,
        "symmetric": False,
        "log_prefix": "train/entropy_clip",
    }
