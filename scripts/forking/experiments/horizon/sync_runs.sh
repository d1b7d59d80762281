#!/usr/bin/env bash
# Copy the finished runs of the run worktree (default /work/wt/horizon-runs, checked out at the pre-registration
# commit) into this checkout's per_run/, then regenerate the tables and the generated blocks.
set -euo pipefail
src=${1:-/work/wt/horizon-runs}/scripts/forking/experiments/horizon/per_run
dst=$(git rev-parse --show-toplevel)/scripts/forking/experiments/horizon/per_run
for d in "$src"/*/; do
  n=$(basename "$d")
  if [ -f "$d/done.json" ]; then mkdir -p "$dst/$n" && cp "$d"/eval.csv "$d"/train.csv "$d"/done.json "$dst/$n/"; fi
done
python scripts/forking_horizon.py --status
python scripts/forking_horizon.py --analyze --update-readme > /dev/null
