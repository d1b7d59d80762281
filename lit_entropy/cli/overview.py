"""What ``lit-entropy`` is and its commands: the top-level ``--help`` and each command's one line."""

from __future__ import annotations

__all__ = ["COMMANDS", "HELP"]

#: The commands and one line on each (also the ``fit`` / ``validate`` / ``test`` lines of their own ``--help``).
COMMANDS = {
    "fit": "train a policy with GRPO or PPO (after validating the starting model) and export it",
    "validate": "avg@K and pass@k of a model or checkpoint on the validation data",
    "test": "avg@K and pass@k of a model or checkpoint on the test data",
    "export": "a checkpoint's policy as a Hugging Face save_pretrained directory",
}

HELP = f"""usage: lit-entropy [-h] [--version] {{{",".join(COMMANDS)}}} ...

lit_entropy: reinforcement fine-tuning of causal language models (GRPO, PPO) with PyTorch Lightning,
built around entropy dynamics (Clip_B, Clip_V, Clip-Cov, KL-Cov, entropy control).

commands:
{chr(10).join(f"  {name:<10}{text}" for name, text in COMMANDS.items())}

options:
  -h, --help  show this help message and exit
  --version   print the version and exit

'lit-entropy COMMAND --help' lists a command's settings, each with its meaning and default. Examples:
  lit-entropy fit --config configs/grpo_tiny.yaml
  lit-entropy fit --config runs/grpo_tiny/version_0/config.yaml \\
      --ckpt_path runs/grpo_tiny/version_0/checkpoints/last.ckpt          # resume a run
  lit-entropy validate --config runs/grpo_tiny/version_0/config.yaml \\
      --ckpt_path runs/grpo_tiny/version_0/checkpoints/last.ckpt          # logs into version_0/validate_step_<S>
  lit-entropy export --ckpt_path CKPT --out DIR [--overwrite]
"""
