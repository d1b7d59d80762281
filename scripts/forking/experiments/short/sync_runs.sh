#!/usr/bin/env bash
# Copy the finished runs of the run worktree (default /work/wt/short-runs, checked out at the commit that added
# this experiment's base models) into this checkout's per_run/, then regenerate the tables and the generated blocks.
set -euo pipefail
src=${1:-/work/wt/short-runs}/scripts/forking/experiments/short/per_run
dst=$(git rev-parse --show-toplevel)/scripts/forking/experiments/short/per_run
for d in "$src"/*/; do
  n=$(basename "$d")
  if [ -f "$d/done.json" ]; then mkdir -p "$dst/$n" && cp "$d"/eval.csv "$d"/train.csv "$d"/done.json "$dst/$n/"; fi
done
python scripts/forking_horizon.py --experiment short --status
python scripts/forking_horizon.py --experiment short --analyze --update-readme > /dev/null
