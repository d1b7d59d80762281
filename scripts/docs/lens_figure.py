"""The lens, measured (issue 38 §3): the entropy-control methods on the (S_k, A) plane of one real batch.

    nice python -m scripts.docs.lens_figure                 # 30 GRPO steps, then the figure and its numbers
    python -m scripts.docs.lens_figure --update-docs        # rewrite docs/theory.md's lens table from the JSON
    python -m scripts.docs.lens_figure --check              # exit 1 when docs/theory.md disagrees with the JSON

The embedded default (``configs/grpo_tiny.yaml``, seed 0) trains ``--steps`` GRPO steps; the next training batch is
then sampled and scored, and its statistics pass computes each response token's ``S_k = p_k (H + log p_k)``, the
policy average ``E_p[S]`` and GRPO's advantage ``A``. Each method's callback, built from its tiny config
(``configs/<method>_tiny.yaml``: the settings its ``val/avg@8`` was measured with), is then asked for that batch's
advantages and keep mask exactly as the training step asks (:func:`lit_entropy.step.apply_token_requests`), each
on its own, as if the batch were its first (fresh state: STARE's controller, REPO-R's initial entropy and
Entrocraft's band at their starts).

Per method the JSON holds the tokens kept, masked and reweighted, and the first-order entropy change of one
on-policy step in units of the learning rate, ``dH = -sum_t A_t (S_t - E_p[S]_t) / n`` (docs/theory.md §3, with
``r = 1``; ``n`` response tokens, token-mean), over the tokens the method keeps with the advantages it gives:
``dh`` for the method, ``dh_removed`` GRPO's share on the tokens it masks, ``dh_reweighting`` the change its
advantages make on the kept ones (``dh = dh_grpo - dh_removed + dh_reweighting``). The figure draws each method's
panel: every response token at ``(S_k, A)``, kept ones grey, masked red, reweighted up blue / down orange.
``tests/scripts/test_lens_figure.py`` reruns the generator on a tiny model and checks every number against the
callbacks' own masks and advantages.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from lightning.pytorch import Trainer, seed_everything

from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.step import RolloutStatistics, build_experience
from lit_entropy.step.token_requests import apply_token_requests

REPO = Path(__file__).resolve().parents[2]
FIGURE = REPO / "docs" / "figures" / "lens.png"
NUMBERS = REPO / "docs" / "figures" / "lens.json"
THEORY = REPO / "docs" / "theory.md"
MARKER = "lens-table"
#: The methods drawn, each by the tiny config that holds its callback (None: GRPO itself).
METHODS: dict[str, str | None] = {
    "grpo": None,
    "clip_b": "configs/clip_b_tiny.yaml",
    "stare": "configs/stare_tiny.yaml",
    "entrocraft": "configs/entrocraft_tiny.yaml",
    "s2t": "configs/s2t_tiny.yaml",
    "advantage_reweighting": "configs/advantage_reweighting_tiny.yaml",
    "unlikeliness": "configs/unlikeliness_tiny.yaml",
    "repo_r": "configs/repo_r_tiny.yaml",
}
#: Whole-run length of the tiny configs: what a callback that schedules over the run (Entrocraft) is told.
RUN_STEPS = 270


def method_callback(config: str) -> Any:
    """The first callback of a tiny config, built from its ``class_path`` and ``init_args``."""
    spec = yaml.safe_load((REPO / config).read_text())["trainer"]["callbacks"][0]
    module_name, _, class_name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)(**spec.get("init_args", {}))


def lens_numbers(experience: Any, shaped: Any) -> dict[str, float]:
    """A method's numbers on one batch (float64): token counts and first-order entropy changes (see the module doc).

    Args:
        experience: the batch under GRPO (``response_mask``, ``advantages``, ``discriminator``, ``policy_average``).
        shaped: the same batch after the method (its ``loss_mask`` and ``advantages``).
    """
    mask = experience.response_mask
    keep = shaped.loss_mask & mask
    centred = (experience.discriminator - experience.policy_average).double()
    before, after = experience.advantages.double(), shaped.advantages.double()
    n = max(int(mask.sum()), 1)
    per_token = -before * centred
    changed = keep & ((after - before).abs() > 1e-9)
    return {
        "tokens": float(mask.sum()),
        "masked": float((mask & ~keep).sum()),
        "reweighted": float(changed.sum()),
        "reweighted_up": float((changed & (after.abs() > before.abs())).sum()),
        "dh_grpo": float(per_token[mask].sum()) / n,
        "dh": float((-after * centred)[keep].sum()) / n,
        "dh_removed": float(per_token[mask & ~keep].sum()) / n,
        "dh_reweighting": float((-(after - before) * centred)[keep].sum()) / n,
    }


def apply_method(module: Any, experience: Any, callback: Any) -> Any:
    """``experience`` after one method's advantages and keep mask, asked as the training step asks them."""

    shaped = copy.copy(experience)
    shaped.advantages = experience.advantages.clone()
    callbacks = [] if callback is None else [callback]
    return apply_token_requests(SimpleNamespace(callbacks=callbacks, max_steps=RUN_STEPS), module, shaped)


def lens_batch(module: Any, batch: dict[str, Any]) -> Any:
    """One training batch sampled, scored and passed through the statistics pass with ``E_p[S]`` (GRPO's
    experience, no callback)."""

    rollout = module.generate(batch, module.settings.sampling)
    rewards, _ = module.score(batch, rollout, module.settings.sampling.num_samples)
    with torch.no_grad():
        forward = module.policy_forward(module.policy, rollout, policy_average=True)
    statistics = RolloutStatistics.from_passes(forward.stats)
    return build_experience(rollout, rewards, statistics, module.settings, eos_token_ids=module.eos_token_ids())


def run_lens(steps: int, overrides: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any, dict[str, Any], Any]:
    """Train ``steps`` (>= 1) GRPO steps of the embedded default (``overrides``: model / data settings for tests), then
    apply every method to the next batch. Returns the numbers, GRPO's experience, each method's and the module."""

    config = yaml.safe_load((REPO / "configs" / "grpo_tiny.yaml").read_text())
    config["model"].setdefault("logging", {})["export_on_train_end"] = False
    for group, values in (overrides or {}).items():
        config[group].update(values)
    seed_everything(config.get("seed_everything", 0))
    module, data = RFTModule(**config["model"]), PromptDataModule(**config["data"])
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(module, data)
    module.trainer = None  # detached: the callbacks asked below keep their metrics instead of logging them
    loader = data.train_dataloader()
    batch = next(b for i, b in enumerate(loader) if i == steps % len(loader))  # the next batch of the first epoch
    torch.manual_seed(steps)
    experience = lens_batch(module, batch)
    shaped = {}
    for name, config_path in METHODS.items():
        shaped[name] = apply_method(module, experience, None if config_path is None else method_callback(config_path))
    numbers = {
        "steps": steps,
        "methods": {name: lens_numbers(experience, after) for name, after in shaped.items()},
    }
    return numbers, experience, shaped, module


def draw(experience: Any, shaped: dict[str, Any], numbers: dict[str, Any], out: Path) -> None:
    """One panel per method: response tokens at ``(S_k, A)``, coloured by what the method does to them."""
    import matplotlib  # reason: plotting only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # reason: plotting only here

    mask = experience.response_mask
    s = experience.discriminator[mask].double()
    a = experience.advantages[mask].double()
    fig, axes = plt.subplots(2, 4, figsize=(14, 6.4), sharex=True, sharey=True)
    for ax, (name, after) in zip(axes.flat, shaped.items(), strict=True):
        keep = after.loss_mask[mask]
        new = after.advantages[mask].double()
        up = keep & ((new - a).abs() > 1e-9) & (new.abs() > a.abs())
        down = keep & ((new - a).abs() > 1e-9) & ~(new.abs() > a.abs())
        plain = keep & ~up & ~down
        parts = ((plain, "0.7", "kept"), (up, "tab:blue", "|A| up"), (down, "tab:orange", "|A| down"))
        for part, colour, label in (*parts, (~keep, "tab:red", "masked")):
            ax.scatter(s[part], a[part], s=6, c=colour, label=f"{label} ({int(part.sum())})", alpha=0.8, linewidths=0)
        ax.axhline(0, c="k", lw=0.5)
        ax.axvline(0, c="k", lw=0.5)
        m = numbers["methods"][name]
        ax.set_title(f"{name}\ndH {m['dh']:+.4f} (GRPO {m['dh_grpo']:+.4f}) x eta", fontsize=9)
        ax.legend(fontsize=7, loc="upper right", markerscale=2)
    for ax in axes[1]:
        ax.set_xlabel("S_k = p_k (H + log p_k)")
    for ax in axes[:, 0]:
        ax.set_ylabel("A (GRPO's)")
    fig.suptitle(
        f"One batch of the embedded default after {numbers['steps']} GRPO steps: each method on the (S_k, A) plane"
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def table(numbers: dict[str, Any]) -> str:
    """docs/theory.md's lens table from the JSON."""
    rows = [
        f"<!-- {MARKER}: generated by `python -m scripts.docs.lens_figure --update-docs`; do not edit by hand -->",
        "| method | tokens masked | tokens reweighted (abs(A) up) | first-order dH x eta | GRPO's dH removed | "
        "dH added by reweighting |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in numbers["methods"].items():
        rows.append(
            f"| {name} | {int(m['masked'])} / {int(m['tokens'])} | {int(m['reweighted'])} ({int(m['reweighted_up'])}) "
            f"| {m['dh']:+.5f} | {m['dh_removed']:+.5f} | {m['dh_reweighting']:+.5f} |"
        )
    rows.append(f"<!-- /{MARKER} -->")
    return "\n".join(rows)


def _block_pattern() -> re.Pattern[str]:
    return re.compile(rf"<!-- {MARKER}:.*?<!-- /{MARKER} -->", re.S)


def update_docs(numbers: dict[str, Any]) -> None:
    text = THEORY.read_text()
    if not _block_pattern().search(text):
        raise SystemExit(f"{THEORY} has no <!-- {MARKER}: ... --> block")
    THEORY.write_text(_block_pattern().sub(lambda _: table(numbers), text))


def check_docs(numbers: dict[str, Any]) -> bool:
    found = _block_pattern().search(THEORY.read_text())
    return found is not None and found.group(0) == table(numbers)


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps before the batch, >= 1 (default 30)")
    parser.add_argument("--figure", type=Path, default=FIGURE, help="where the PNG goes")
    parser.add_argument("--json", type=Path, default=NUMBERS, help="where the numbers go")
    parser.add_argument("--model-dir", default=None, help="another model directory (tests: a tiny random one)")
    parser.add_argument("--update-docs", action="store_true", help="rewrite docs/theory.md's table from --json")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/theory.md disagrees with --json")
    args = parser.parse_args(argv)
    if args.update_docs or args.check:
        numbers = json.loads(args.json.read_text())
        if args.check:
            ok = check_docs(numbers)
            print("docs/theory.md's lens table " + ("matches" if ok else "differs from") + f" {args.json}")
            return 0 if ok else 1
        update_docs(numbers)
        return 0
    overrides = {} if args.model_dir is None else {"model": {"policy": {"model_name_or_path": args.model_dir}},
                                                    "data": {"tokenizer_name_or_path": args.model_dir}}  # fmt: skip
    load = os.getloadavg()
    numbers, experience, shaped, _ = run_lens(args.steps, overrides)
    numbers.update(commit=_commit(), load_average=[round(x, 1) for x in load], config="configs/grpo_tiny.yaml")
    draw(experience, shaped, numbers, args.figure)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(numbers, indent=2) + "\n")
    print(table(numbers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
