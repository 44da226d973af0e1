#!/usr/bin/env bash
# Planner accuracy: profile the device, plan at several memory limits (and a few hand-picked
# variants), then `pi2 bench --plan` each plan: predicted against measured decode speed.
#
#   bench/planner_accuracy.sh MODEL.gguf [EMULATED_FLASH]
#
# MODEL must be made by `pi2 convert`. EMULATED_FLASH (e.g. 100us,800MB/s) reads through an
# emulated device of steady speed instead of the real disk. Plans go to a temporary folder;
# the hardware profile to $PI2_CACHE_DIR (default: a temporary folder too).
set -euo pipefail
model=${1:?usage: $0 MODEL.gguf [EMULATED_FLASH]}
emu=${2:-}
cd "$(dirname "$0")/.."
cargo build --release -q -p pi2-cli
pi2=$PWD/target/release/pi2
work=$(mktemp -d)
export PI2_CACHE_DIR=${PI2_CACHE_DIR:-$work/cache}
emu_args=()
[ -n "$emu" ] && emu_args=(--emulate-flash "$emu")
"$pi2" profile-hw -m "$model" "${emu_args[@]}" 2>/dev/null
plans=()
for spec in "p120:120%:" "p100:100%:" "p90:90%:" "p75:75%:" "p50:50%:" "p25:25%:" \
  "h100_t1:100%:threads=1" "h100_t2:100%:threads=2" "h100_hot0:100%:hot_share=0" \
  "h100_gap0:100%:merge_gap=0" "h100_c32:100%:cluster=32" "h75_hot05:75%:hot_share=0.5" \
  "h50_t1:50%:threads=1" "h50_hot0:50%:hot_share=0" "h25_t1:25%:threads=1" "h25_c32:25%:cluster=32"; do
  IFS=: read -r name limit fix <<< "$spec"
  fix_args=()
  [ -n "$fix" ] && fix_args=(--fix "$fix")
  echo "== $name: --mem-limit $limit $fix"
  if "$pi2" plan -m "$model" -c 256 --mem-limit "$limit" "${emu_args[@]}" "${fix_args[@]}" \
    -o "$work/$name.json" 2>&1 | grep -E "^plan:|^predicted:|^error"; then
    [ -f "$work/$name.json" ] && plans+=("$name")
  fi
done
for name in "${plans[@]}"; do
  "$pi2" bench -m "$model" -p 0 -n 32 -r 3 --plan "$work/$name.json" 2>/dev/null | tail -1 | sed "s/^/$name /"
done
echo "plans in $work"
