#!/usr/bin/env bash
# Copy the finished runs of a separate run worktree (default /work/wt/study-runs, checked out at the recorded code
# revision) into this checkout's per_run/, then regenerate the tables and the README block.
#   sync_runs.sh [RUN_WORKTREE] [EXPERIMENT]    # EXPERIMENT: sod (default), sod_clipv or sod_robust
set -euo pipefail
experiment=${2:-sod}
src=${1:-/work/wt/study-runs}/scripts/forking/experiments/$experiment/per_run
dst=$(git rev-parse --show-toplevel)/scripts/forking/experiments/$experiment/per_run
for d in "$src"/*/; do
  n=$(basename "$d")
  if [ -f "$d/done.json" ]; then mkdir -p "$dst/$n" && cp "$d"/eval.csv "$d"/train.csv "$d"/done.json "$dst/$n/"; fi
done
python -m scripts.studies.sod --experiment "$experiment" --status
python -m scripts.studies.sod --experiment "$experiment" --analyze --update-readme > /dev/null
