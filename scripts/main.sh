#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the
# Fashion-MNIST CNN with DistributedDataParallel on 2 processes through
# ddprun. Extra arguments go to ddp-train (see ddp-train --help), e.g.
#   bash scripts/main.sh --epochs 2
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${DDP_BUILD_DIR:-build}
exec "$build/tools/ddprun/ddprun" --standalone --nproc-per-node 2 \
  "$build/tools/ddp-train/ddp-train" --out-dir "${DDP_OUT_DIR:-out/ddp-train}" "$@"
