#!/usr/bin/env bash
# The first-GPU check (issue 34): SmolLM2-135M-Instruct in bf16, 10 GRPO steps with the HF engine, the vLLM engine
# (sleep mode, CUDA graphs), FSDP2 over every visible GPU, and TRL's GRPOTrainer; one table (s/step, peak GPU
# memory, mismatch KL, passed). About 8 minutes on one GPU. Needs the smollm2 extra, and for the vllm / trl parts
# the vllm and bench extras. On a machine without CUDA it checks that every command parses and says it needs a GPU.
#   bash scripts/gpu_check.sh [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m scripts.bench.gpu_check "$@"
