#!/usr/bin/env bash
# SIGKILL a 2-rank ddp-train at random moments, over and over, resuming each
# time from the latest checkpoint; then check that the run ends with exactly
# the parameters of an uninterrupted run (ddp-train's exact checksum line).
#
#   bash scripts/kill_stress.sh [KILLS=50] [BUILD_DIR=build] [EPOCHS=400]
#
# Each kill takes the launcher and every worker down at once (kill -9 of the
# job's process group), like a machine losing power. Odd kills come at a
# random moment; even kills aim at a checkpoint write: they wait until rank
# 0's temporary file appears and kill at once (epochs of a few steps, a
# checkpoint after each). Kills that landed inside a write are counted by
# the temporary file they leave. Exits 0 when every resume loaded its
# checkpoint and the final parameters match.
set -euo pipefail
kills=${1:-50}
build=${2:-build}
epochs=${3:-400}
ddprun="$build/tools/ddprun/ddprun"
train="$build/tools/ddp-train/ddp-train"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--train-samples 512 --test-samples 100 --epochs "$epochs" --batch-size 32 --no-plot
      --log-every 1000 --timeout 60)
# 8 steps of 2 x 32 per epoch, a checkpoint after each.

checksum() { grep -o 'parameters identical on all 2 ranks (checksum [^)]*)' "$1" | tail -n 1; }

echo "kill_stress: reference run (uninterrupted)"
"$ddprun" --standalone --nproc-per-node 2 "$train" "${args[@]}" --out-dir "$work/ref" >"$work/ref.log" 2>&1
want=$(checksum "$work/ref.log")
[ -n "$want" ] || { echo "kill_stress: reference run failed"; tail "$work/ref.log"; exit 1; }

# A checkpoint's temporary file that the current attempt created (stale ones
# from a kill before stay until the next save removes them).
shopt -s nullglob
new_tmp() {
  local f
  for f in "$work/run/checkpoints/".*.tmp.*; do
    [[ " $stale " == *" $f "* ]] || return 0
  done
  return 1
}

in_write=0
for ((i = 1; i <= kills; i++)); do
  stale=$(echo "$work/run/checkpoints/".*.tmp.*)
  setsid "$ddprun" --standalone --nproc-per-node 2 "$train" "${args[@]}" --resume \
    --out-dir "$work/run" >"$work/run.log" 2>&1 &
  pid=$!
  # Random moment after the ranks have met (start-up time varies with load).
  for ((t = 0; t < 600; t++)); do
    grep -q "ddp-train: world_size" "$work/run.log" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ((i % 2 == 0)); then
    # Mid-write: poll (globbing, no fork) for a temporary file that was not
    # there before this attempt, for up to ~5 s, after letting a random
    # number of writes (0-2) finish.
    skip=$((RANDOM % 3))
    for ((t = 0; t < 200000; t++)); do
      if new_tmp; then
        ((skip-- > 0)) || break
        while new_tmp; do :; done
      fi
      kill -0 "$pid" 2>/dev/null || break
    done
  else
    sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", rand() * 4 }')"
  fi
  kill -9 -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if new_tmp; then in_write=$((in_write + 1)); fi
  if grep -q "ddp-train failed" "$work/run.log"; then
    echo "kill_stress: attempt $i failed before the kill:"; tail -n 20 "$work/run.log"; exit 1
  fi
  ckpts=("$work/run/checkpoints/"*.ddpckpt)  # sorted by the glob; zero-padded names
  latest=none
  ((${#ckpts[@]} == 0)) || latest=${ckpts[${#ckpts[@]} - 1]}
  echo "kill_stress: kill $i/$kills; latest checkpoint: ${latest##*/}"
done
echo "kill_stress: final resume to the end"
"$ddprun" --standalone --nproc-per-node 2 "$train" "${args[@]}" --resume --out-dir "$work/run" \
  >"$work/final.log" 2>&1 || { tail -n 30 "$work/final.log"; exit 1; }
got=$(checksum "$work/final.log")
echo "kill_stress: $kills kills, $in_write during a checkpoint write"
echo "kill_stress: reference: $want"
echo "kill_stress: resumed:   $got"
[ "$want" = "$got" ] && echo "kill_stress: OK" || { echo "kill_stress: MISMATCH"; exit 1; }
