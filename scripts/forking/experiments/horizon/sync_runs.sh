#!/usr/bin/env bash
# Copy the finished runs of a run worktree (checked out at the experiment's pinned commit) into this checkout's
# per_run/, then regenerate the tables and the generated blocks.
#   sync_runs.sh [RUN_WORKTREE] [EXPERIMENT]    # EXPERIMENT: horizon (default, /work/wt/horizon-runs) or short
#                                               # (/work/wt/short-runs)
set -euo pipefail
experiment=${2:-horizon}
src=${1:-/work/wt/$experiment-runs}/scripts/forking/experiments/$experiment/per_run
dst=$(git rev-parse --show-toplevel)/scripts/forking/experiments/$experiment/per_run
for d in "$src"/*/; do
  n=$(basename "$d")
  if [ -f "$d/done.json" ]; then mkdir -p "$dst/$n" && cp "$d"/eval.csv "$d"/train.csv "$d"/done.json "$dst/$n/"; fi
done
python -m scripts.studies.horizon --experiment "$experiment" --status
python -m scripts.studies.horizon --experiment "$experiment" --analyze --update-readme > /dev/null
