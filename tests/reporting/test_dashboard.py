"""What a user sees in TensorBoard: the tag set is docs/dashboard.md's table, no silent constants, HPARAMS, steps."""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_entropy.reporting.batch_statistics import batch_statistics
from lit_entropy.reporting.console import ConsoleMetrics
from lit_entropy.reporting.dashboard import DashboardRun, StepReport, TrainDashboard
from lit_entropy.reporting.evaluation import SampleEvaluator
from lit_entropy.reporting.hparams import flatten_hparams, run_label
from lit_entropy.reporting.samples import informative_groups, samples_markdown
from lit_entropy.reporting.tag_plan import TagPlan
from lit_entropy.rollout import RolloutBatch

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def readme_tag_table() -> list[dict[str, str]]:
    """Rows of docs/dashboard.md's tag table: tag, condition (first code span of "When"), constant note."""
    text = (ROOT / "docs" / "dashboard.md").read_text()
    section = text[text.index("\n## Tags\n") + 1 :]
    end = section.find("\n## ")  # the next section, if any
    section = section if end < 0 else section[:end]
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
    """The documented tags for a run whose active conditions are ``conditions``, as event-file tag names."""
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
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})  # keep all
    events.Reload()
    tags = events.Tags()
    scalars = {t: [(e.step, e.value) for e in events.Scalars(t)] for t in tags["scalars"]}
    histograms = {t: [e.step for e in events.Histograms(t)] for t in tags["histograms"]}
    layout_tag = "custom_scalars__config__"
    texts = {t: [e.step for e in events.Tensors(t)] for t in tags["tensors"] if t != layout_tag}
    tables = [e.tensor_proto.string_val[0].decode() for e in events.Tensors("train/samples/text_summary")]
    layouts = [layout_pb2.Layout.FromString(e.tensor_proto.string_val[0]) for e in events.Tensors(layout_tag)]
    plugin = plugin_event_accumulator.EventAccumulator(str(log_dir))
    plugin.Reload()
    contents = plugin.PluginTagToContent("hparams")
    experiment = session = None
    if "_hparams_/experiment" in contents:
        experiment = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/experiment"]).experiment
    if "_hparams_/session_start_info" in contents:
        start = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"])
        session = start.session_start_info
    return {
        "scalars": scalars, "histograms": histograms, "texts": texts, "tables": tables, "layouts": layouts,
        "hparams": experiment, "session": session,
    }  # fmt: skip


def _is_break(c: str) -> bool:
    return c == "/" or c.isdigit()


def tensorboard_tag_order(a: str, b: str) -> int:
    """TensorBoard's Time Series order of two tags (a port of its frontend's ``compareTagNames``): digit runs
    compare as numbers, ``/`` and digits before any other character, else character codes."""
    i = j = 0
    while True:
        if i == len(a):
            return 0 if j == len(b) else -1
        if j == len(b):
            return 1
        if a[i].isdigit() and b[j].isdigit():
            i2, j2 = i, j
            while i2 < len(a) and a[i2].isdigit():
                i2 += 1
            while j2 < len(b) and b[j2].isdigit():
                j2 += 1
            x, y = int(a[i:i2]), int(b[j:j2])
            if x != y:
                return -1 if x < y else 1
            i, j = i2, j2
            continue
        if _is_break(a[i]) != _is_break(b[j]):
            return -1 if _is_break(a[i]) else 1
        if a[i] != b[j]:
            return -1 if a[i] < b[j] else 1
        i, j = i + 1, j + 1


def time_series_groups(tags: list[str]) -> list[tuple[str, list[str]]]:
    """Time Series' card groups in screen order: tags sorted as TensorBoard does, grouped by their first part."""
    import functools

    groups: dict[str, list[str]] = {}
    for tag in sorted(tags, key=functools.cmp_to_key(tensorboard_tag_order)):
        groups.setdefault(tag.split("/", 1)[0], []).append(tag)
    return list(groups.items())


@pytest.mark.parametrize(
    ("config", "conditions"),
    [
        ("grpo_tiny.yaml", {"always", "grouped", "samples", "engine log-probs"}),
        ("clip_b_tiny.yaml", {"always", "grouped", "samples", "mask callback", "entropy clipping", "engine log-probs"}),
        ("dapo_tiny.yaml", {"always", "grouped", "samples", "engine log-probs", "dynamic sampling"}),
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
            assert expected[tag]["constant"], (
                f"{tag} is constant over the run ({points}); docs/dashboard.md does not say why"
            )

    train_steps = [step for step, _ in run["scalars"]["train/reward/mean"]]
    sampled = [0, 2]  # samples and histograms every 2 batches, at the steps of those batches' scalars
    if "dynamic sampling" in conditions:  # an update's scalars only at the batch that ended its fill
        drawn = {step: int(value) for step, value in run["scalars"]["train/filter/gen_batches"]}
        assert train_steps and list(drawn) == train_steps
        assert [drawn[step] for step in train_steps] == [
            b - a for a, b in zip([-1, *train_steps[:-1]], train_steps, strict=True)
        ]
        for tag, points in run["scalars"].items():
            if tag.startswith("train/"):
                assert [step for step, _ in points] == train_steps, tag
        # an update logs samples when its fill drew a batch at a multiple of 2
        sampled = [step for step in train_steps if any((step - back) % 2 == 0 for back in range(drawn[step]))]
    else:
        assert train_steps == [0, 1, 2, 3]
    assert run["histograms"]["train/entropy/tokens"] == sampled
    assert run["texts"]["train/samples/text_summary"] == sampled

    check_first_screen(run, masking="mask callback" in conditions)
    check_method_hparams(run, clip_b="entropy clipping" in conditions, name=config.removesuffix(".yaml"))
    check_samples_order(run["tables"])
    assert "hp_metric" not in run["scalars"]  # no placeholder metric (default_hp_metric: false)

    # stdout is captured (not a terminal): one line per logged step, TensorBoard's steps; a validation value only
    # on the step it was logged at (before training: 0; after 2 and 4 batches: 2 and 4, the last on its own line).
    val_steps = [step for step, _ in run["scalars"]["val/avg@8"]]
    assert val_steps == [0, 2, 4]
    # A batch that logged neither (dynamic sampling: no update) prints no line.
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    printed = sorted({*train_steps, *val_steps})
    assert [line.split(" | ")[0] for line in lines] == [f"step {step}" for step in printed]
    assert [step for step, line in zip(printed, lines, strict=True) if "val/avg@8" in line] == val_steps
    values = dict(run["scalars"]["val/avg@8"])
    for step in val_steps:
        assert f"val/avg@8 {values[step]:.3f}" in lines[printed.index(step)]
    for step, line in zip(printed, lines, strict=True):
        assert ("reward" in line) == (step in train_steps) and ("s/step" in line or step not in train_steps)


def check_first_screen(run: dict, masking: bool) -> None:
    """Time Series opens on the overview cards in reading order; CUSTOM SCALARS has the layout; no ``epoch``."""
    scalars = run["scalars"]
    assert "epoch" not in scalars  # Lightning's staircase
    groups = time_series_groups(list(scalars))
    masked = ["overview/7_masked_frac"] if masking else []
    assert groups[0] == (
        "overview",
        ["overview/1_reward", "overview/2_val_avg@8", "overview/3_val_pass@8", "overview/4_entropy",
         "overview/5_length", *masked, "overview/8_tokens_per_s"],
    )  # fmt: skip
    train = dict(groups)["train"]
    advantages = [i for i, tag in enumerate(train) if "advantage" in tag]
    assert advantages and min(advantages) > train.index("train/reward/mean")
    copies = {
        "overview/1_reward": "train/reward/mean", "overview/2_val_avg@8": "val/avg@8",
        "overview/3_val_pass@8": "val/pass@8", "overview/4_entropy": "train/entropy/mean",
        "overview/5_length": "train/length/mean", "overview/8_tokens_per_s": "perf/tokens_per_s",
    }  # fmt: skip
    for card, source in copies.items():
        assert scalars[card] == scalars[source], card
    if masking:  # one mask callback: the share it masked is the share left out of the loss
        masked_frac = [value for _, value in scalars["overview/7_masked_frac"]]
        assert masked_frac == pytest.approx([value for _, value in scalars["train/entropy_clip/frac"]], abs=1e-6)
    (layout,) = run["layouts"]
    assert [category.title for category in layout.category] == ["Overview", "Update", "Time"]
    for category in layout.category:
        for chart in category.chart:
            patterns = list(chart.multiline.tag)
            assert any(re.fullmatch(p, tag) for p in patterns for tag in scalars), (chart.title, patterns)


def check_method_hparams(run: dict, clip_b: bool, name: str) -> None:
    """HPARAMS: one session per run, named readably, with the model's groups but logging, the data settings but
    plumbing, and the callback's effective arguments; no experiment summary (TensorBoard would read one run's)."""
    import inspect

    from lit_entropy.data.datamodule import PromptDataModule
    from lit_entropy.module import RFTModule

    assert run["hparams"] is None, "an experiment summary hides other runs' columns"
    session = run["session"]
    assert session is not None, "no HPARAMS session"
    assert session.group_name == f"{name} v0"  # the config's logger name
    names = set(session.hparams)
    model_groups = set(inspect.signature(RFTModule.__init__).parameters) - {"self", "rollout", "logging"}
    assert {n.split("/")[1] for n in names if n.startswith("model/")} == model_groups
    plumbing = {"num_workers", "cache_dir", "tokenizer_name_or_path"}
    assert {n[len("data/") :] for n in names if n.startswith("data/")} == (
        set(inspect.signature(PromptDataModule.__init__).parameters) - {"self"} - plumbing
    )
    callbacks = {n for n in names if n.startswith("callbacks")}
    clip = {f"callbacks/EntropyDiscriminatorClipping/{a}" for a in ("method", "mu", "symmetric")}
    # Clip_B ignores max_frac; no checkpoint / console / run-directory callbacks.
    assert callbacks == ({"callbacks", *clip} if clip_b else {"callbacks"})
    assert session.hparams["callbacks"].string_value == ("EntropyDiscriminatorClipping" if clip_b else "none")
    assert all(n.split("/")[0] in ("model", "data", "callbacks") for n in names)


def check_samples_order(tables: list[str]) -> None:
    """Each samples table leads with the groups whose rewards differ most; all-equal groups come last."""
    assert tables
    for table in tables:
        groups: list[list[float]] = []
        for row in table.splitlines()[2:]:
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            if cells[0]:
                groups.append([])
            groups[-1].append(float(cells[4]))
        spreads = [float(torch.tensor(g, dtype=torch.float64).std(unbiased=False)) for g in groups]
        assert spreads == sorted(spreads, reverse=True), spreads


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
    assert out["train/update/advantage/mean"] == pytest.approx(float(torch.stack(valid).mean()), rel=1e-6)
    assert out["train/update/advantage/std"] == pytest.approx(float(torch.stack(valid).std()), rel=1e-6)
    assert out["train/update/advantage/max"] == pytest.approx(float(max(valid)))
    assert out["train/length/mean"] == pytest.approx(sum(lengths) / 6)
    assert (out["train/length/min"], out["train/length/max"]) == (1.0, 4.0)
    # Length 4 = max_new_tokens without EOS: rows 0 and 5 (row 2 ended with its EOS at the limit).
    assert out["train/length/truncated_frac"] == pytest.approx(2 / 6)
    kept = [ent[i, j] for i in range(6) for j in range(lengths[i]) if keep[i, j]]
    masked = [ent[i, j] for i in range(6) for j in range(lengths[i]) if not keep[i, j]]
    assert out["train/entropy/kept"] == pytest.approx(float(torch.stack(kept).mean()), rel=1e-6)
    assert out["train/entropy/masked"] == pytest.approx(float(torch.stack(masked).mean()), rel=1e-6)
    assert out["train/mask/loss_token_frac"] == pytest.approx(len(kept) / sum(lengths))
    assert out["overview/7_masked_frac"] == pytest.approx(len(masked) / sum(lengths))
    assert "train/entropy/kept" not in batch_statistics(exp, 2, 4, [2], TagPlan())


def test_tag_plan_decides_from_explicit_facts():
    from lit_entropy.rollout import HFRolloutEngine, RolloutEngine
    from lit_entropy.settings import LossConfig, OptimConfig

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
    # train/clip/dual: off-policy, and a loss that applies the dual clip with a constant set
    engine = HFRolloutEngine()
    for updates, loss, dual in [
        (4, LossConfig(), True),  # ppo, clip_ratio_c 3.0 by default
        (4, LossConfig(clip_ratio_c=None), False),
        (4, LossConfig(policy_loss="gspo", clip_ratio_c=None), False),
        (4, LossConfig(policy_loss="cispo"), False),  # the default 3.0 is accepted, and not applied
        (1, LossConfig(), False),  # one on-policy update: every ratio is 1
    ]:
        assert TagPlan.decide(updates_per_batch=updates, rollout_engine=engine, loss=loss, **facts).dual_clip is dual


def test_the_dashboard_logs_the_numbers_the_module_hands_it():
    """Everything logged comes from the DashboardRun / StepReport: lr, skipped updates, clip fractions, coefficients."""
    torch.manual_seed(1)
    exp = _experience([1.0, 0.0, 0.25, 1.0], [3, 2, 3, 1], 3, [True] * 4, torch.randn(4, 3), torch.rand(4, 3))
    exp.coefficients, exp.rollout_gap = {"entropy_coef": 0.125}, None
    logged = {}

    def log(name, value, **options):
        logged[name] = (float(value), options)

    plan = TagPlan(off_policy=True, lr_changes=True, grouped=True, coefficient_providers=True, dual_clip=True)
    run = DashboardRun(
        plan=plan, group_size=2, max_new_tokens=3, eos_token_ids=(2,), device=torch.device("cpu"), log=log
    )
    clip = {k: torch.tensor(v) for k, v in {"low": 0.25, "high": 0.5, "total": 0.75, "dual": 0.125}.items()}
    terms = {"pg_loss": -0.5, "grad_norm": 2.0, "approx_kl": 0.01}
    report = StepReport(experience=exp, terms=terms, prompts=2, lr=3e-4, skipped_updates=1, clip=clip)
    TrainDashboard().log_step(run, report)
    assert logged["train/optim/lr"][0] == pytest.approx(3e-4)
    assert logged["train/optim/skipped_updates"][0] == 1.0
    assert logged["train/loss/entropy_coef"][0] == 0.125
    assert {k: logged[f"train/clip/{n}"][0] for n, k in (("ratio", "total"), ("low", "low"), ("high", "high"))} == {
        "total": 0.75, "low": 0.25, "high": 0.5,
    }  # fmt: skip
    assert logged["train/clip/dual"] == (0.125, {"on_step": True, "batch_size": 1})
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
    assert "train/clip/dual" not in quiet


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
    assert len(rows) == 4  # every completion of two prompts
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    # Prompts 1 and 3 have differing rewards, prompt 2 (all correct, advantage 0) is the least informative.
    assert [c[3] for c in cells] == ["2", "3", "6", "7"]
    assert [c[4] for c in cells] == ["1", "0", "1", "0"]
    assert [c[5] for c in cells] == ["+0.7", "-0.7", "+0.7", "-0.7"]
    assert [c[0] for c in cells] == ["1+1=", "", "3+3=", ""]  # the prompt once per group


def test_informative_groups_sort_by_reward_spread_against_brute_force():
    import statistics

    torch.manual_seed(3)
    rewards = torch.randint(0, 3, (40,)).float() / 2  # 10 groups of 4, rewards in {0, .5, 1}: ties and equal groups
    rewards[8:12] = 1.0  # an all-correct group
    groups = [rewards[i : i + 4].tolist() for i in range(0, 40, 4)]
    spread = [statistics.pstdev(g) for g in groups]
    expected = sorted(range(10), key=lambda i: (-spread[i], i))  # most spread first, batch order among ties
    assert informative_groups(rewards, 4) == expected
    assert spread[expected[-1]] == 0.0 and expected.index(2) > max(i for i, g in enumerate(expected) if spread[g] > 0)


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
    flat = flatten_hparams({"a": {"b": 1, "c": None, "d": [1, 2], "e": False}})
    assert flat == {"a/b": 1, "a/c": "None", "a/d": "[1, 2]", "a/e": "False"}
    from lit_entropy.callbacks import EntropyDiscriminatorClipping

    clip_b = EntropyDiscriminatorClipping("clip_b", mu=1.5)
    assert clip_b.hparams() == {"method": "clip_b", "mu": 1.5, "symmetric": False}  # Clip_B has no cap
    clip_v = EntropyDiscriminatorClipping("clip_v", max_frac=0.01)
    assert clip_v.hparams() == {"method": "clip_v", "mu": 8.5, "max_frac": 0.01, "symmetric": False}


def test_hparams_rows_are_named_by_run():
    from lightning.pytorch.loggers import TensorBoardLogger

    assert run_label(TensorBoardLogger("runs", name="clip_b_tiny", version=3)) == "clip_b_tiny v3"
    assert run_label(TensorBoardLogger("runs", name="grpo", version="version_12")) == "grpo v12"
    assert run_label(TensorBoardLogger("runs", name="grpo", version="seed_1")) == "grpo seed_1"
