#!/usr/bin/env bash
# Planner accuracy: profile the device, plan at several memory limits (and a few hand-picked
# variants), then `pi2 bench --plan` each plan: predicted against measured decode speed.
#
#   bench/planner_accuracy.sh MODEL.gguf [EMULATED_FLASH] [ROUNDS]
#
# MODEL must be made by `pi2 convert`. EMULATED_FLASH (e.g. 100us,800MB/s; `-` for none) reads
# through an emulated device of steady speed instead of the real disk. The plans are timed in
# ROUNDS (default 2) round-robin passes, so a spell of outside load or a drift of the device
# touches every plan alike instead of favouring the ones timed first. The summary gives each
# plan's rounds, their mean (a round whose spread exceeds 10% of its mean was disturbed by
# outside load and is left out), its ratio to the prediction ("m / p now": to the prediction
# redone with the flash measured just before the timing, as `bench --plan` does), and at each
# limit the hand-tried plans' speed relative to the chosen one. Where the planner itself picks
# a hand-tried knob (e.g. merge gap 64K), that row times the chosen plan again: the spread
# between identical plans. Plans and raw results go to a temporary folder; the hardware
# profile to $PI2_CACHE_DIR (default: a temporary folder too).
set -euo pipefail
model=${1:?usage: $0 MODEL.gguf [EMULATED_FLASH] [ROUNDS]}
emu=${2:-}
[ "$emu" = - ] && emu=
rounds=${3:-2}
cd "$(dirname "$0")/.."
cargo build --release -q -p pi2-cli
pi2=$PWD/target/release/pi2
work=$(mktemp -d)
export PI2_CACHE_DIR=${PI2_CACHE_DIR:-$work/cache}
emu_args=()
[ -n "$emu" ] && emu_args=(--emulate-flash "$emu")
# PI2_KEEP_HW=1 keeps a profile already in $PI2_CACHE_DIR (e.g. one checked for outside load).
[ -n "${PI2_KEEP_HW:-}" ] || "$pi2" profile-hw -m "$model" "${emu_args[@]}" 2>/dev/null | tail -1
plans=()
for spec in "p120:120%:" "p100:100%:" "p90:90%:" "p75:75%:" "p50:50%:" "p25:25%:" \
  "h100_t1:100%:threads=1" "h100_t2:100%:threads=2" "h100_hot0:100%:hot_share=0" \
  "h100_gap0:100%:merge_gap=0" "h100_c32:100%:cluster=32" "h75_hot05:75%:hot_share=0.5" \
  "h50_t1:50%:threads=1" "h50_hot0:50%:hot_share=0" "h50_gap64k:50%:merge_gap=64K" \
  "h25_t1:25%:threads=1" "h25_c32:25%:cluster=32" "h25_gap64k:25%:merge_gap=64K"; do
  IFS=: read -r name limit fix <<< "$spec"
  fix_args=()
  [ -n "$fix" ] && fix_args=(--fix "$fix")
  echo "== $name: --mem-limit $limit $fix"
  if "$pi2" plan -m "$model" -c 256 --mem-limit "$limit" "${emu_args[@]}" "${fix_args[@]}" \
    -o "$work/$name.json" 2>&1 | grep -E "^plan:|^predicted:|^error"; then
    [ -f "$work/$name.json" ] && plans+=("$name")
  fi
done
for round in $(seq "$rounds"); do
  for name in "${plans[@]}"; do
    "$pi2" bench -m "$model" -p 0 -n 32 -r 3 --plan "$work/$name.json" -o json 2>/dev/null \
      > "$work/$name.r$round.out"
    echo "round $round: $name done"
  done
done
python3 - "$work" "$rounds" "${plans[@]}" <<'EOF'
import json, statistics, sys
work, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for n in names:
    plan = json.load(open(f"{work}/{n}.json"))
    k = plan["knobs"]
    runs = [json.load(open(f"{work}/{n}.r{r}.out"))[0] for r in range(1, rounds + 1)]
    now = [r["predicted_now_ts"] for r in runs if r.get("predicted_now_ts")]
    # A round whose spread exceeds 10% of its mean was disturbed (outside load on the shared
    # machine): it is shown but left out of the mean unless every round was.
    steady = [r["avg_ts"] for r in runs if r["stddev_ts"] <= 0.1 * r["avg_ts"]]
    knobs = "in memory" if k["mode"] != "offload" else (
        f'hot {k["hot_share"]:g}, gap {k["merge_gap"] // 1024}K, max read {k["max_read"] // 1024}K, '
        f'depth {k["io_depth"]}')
    rows[n] = dict(
        limit=n.split("_")[0].lstrip("ph"), pred=plan["predicted"]["decode_tps"],
        now=statistics.mean(now) if now else None, runs=runs,
        mean=statistics.mean(steady or [r["avg_ts"] for r in runs]), all_disturbed=not steady,
        knobs=f'{k["threads"]}t, cluster {k["cluster"]}, {knobs}')
print("| plan | knobs | predicted t/s | " + " | ".join(f"round {r + 1} t/s" for r in range(rounds))
      + " | mean t/s | m / p | m / p now | vs chosen |")
print("| --- | --- | ---: | " + " | ".join("---:" for _ in range(rounds)) + " | ---: | ---: | ---: | ---: |")
for n, r in rows.items():
    chosen = rows.get("p" + r["limit"])
    vs = f'{r["mean"] / chosen["mean"]:.2f}' if chosen and chosen is not r else ""
    cells = " | ".join(
        f'{x["avg_ts"]:.2f} ± {x["stddev_ts"]:.2f}' + (" (disturbed)" if x["stddev_ts"] > 0.1 * x["avg_ts"] else "")
        for x in r["runs"])
    now = f'{r["mean"] / r["now"]:.2f}' if r["now"] else ""
    mark = " (all rounds disturbed)" if r["all_disturbed"] else ""
    print(f'| {n} | {r["knobs"]} | {r["pred"]:.2f} | {cells} | {r["mean"]:.2f}{mark} | {r["mean"] / r["pred"]:.2f} | {now} | {vs} |')
EOF
echo "plans and results in $work"
