#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the
# Fashion-MNIST CNN with DistributedDataParallel on 2 processes through
# ddprun. Extra arguments go to ddp-train (see ddp-train --help), e.g.
#   bash scripts/main.sh --epochs 2
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${DDP_BUILD_DIR:-build}
# The main job's own directory (out/ddp-train) holds the last main job: a
# new one replaces it (ddp-train refuses a directory with another run
# unless told, Note [One run per directory]); --resume continues it. A
# directory you name (--out-dir, --checkpoint-dir, DDP_OUT_DIR) is never
# replaced unless you say --overwrite yourself.
replace=(--overwrite)
[ -n "${DDP_OUT_DIR:-}" ] && replace=()
for a in "$@"; do
  case $a in --resume|--overwrite|--out-dir|--out-dir=*|--checkpoint-dir|--checkpoint-dir=*) replace=() ;; esac
done
exec "$build/tools/ddprun/ddprun" --standalone --nproc-per-node 2 \
  "$build/tools/ddp-train/ddp-train" --out-dir "${DDP_OUT_DIR:-out/ddp-train}" "${replace[@]}" "$@"
