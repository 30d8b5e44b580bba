#!/usr/bin/env bash
# Issue 19's evaluation of one checkpoint on the held-out split, as the results of 2026-12-07 ran
# it: Table 1's shape (16 trajectories x 8 turns) on seeds 0 and 1, and with TABLE2=1 Table 2's
# (16 x 4 against 64 x 1 at 64 kernels a task) on the seeds in T2_SEEDS. The runs of one table go
# to the GPU at once (each kevin eval holds the GPU's timing lease while it times a candidate, so
# the timings are those of a GPU alone). Per evaluation a line: avg@K, best@K, turn-1 correct,
# format errors, mean speedup of the best kernel and of a trajectory's, the share of later turns
# that resubmit a kernel their trajectory already submitted, and how often the next turn
# is correct after a failed turn (by failure kind) and after a correct one.
#
#   KEVIN=target/release/kevin bash benches/eval-heldout.sh CHECKPOINT OUT
#
# Knobs (environment): CONFIG (configs/gpu-burn.toml), SEEDS ("0 1"), SAMPLES and TURNS (16 and 8:
# the issue's; smaller for a quick check), TABLE2 (0), T2_SEEDS ("0"), DEVICE (cuda; cpu evaluates
# with the CPU backend, for a check without a GPU), EXTRA (more `kevin eval` arguments, e.g.
# "--tasks elu,tanh"), DIR (the task folders, `tasks` by default: the 14 held-out tasks;
# benches/data/measure-5151 is the 120-program measurement split, for which SAMPLES=4 TURNS=4
# are its usual shape), BASE (the OUT of an earlier run of this script on the checkpoint to compare
# with, on the same SEEDS: `kevin eval --base --new` then pairs the evaluations by seed, prints
# whether avg@K and the mean speedup rose by more than twice the spread between evaluations of
# one checkpoint, and writes OUT/compare.json).
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: bash benches/eval-heldout.sh CHECKPOINT OUT" >&2
    exit 2
fi
CK=$1
OUT=$2
KEVIN=${KEVIN:-target/release/kevin}
CONFIG=${CONFIG:-configs/gpu-burn.toml}
SEEDS=${SEEDS:-0 1}
SAMPLES=${SAMPLES:-16}
TURNS=${TURNS:-8}
TABLE2=${TABLE2:-0}
T2_SEEDS=${T2_SEEDS:-0}
DEVICE=${DEVICE:-cuda}
EXTRA=${EXTRA:-}
DIR=${DIR:-tasks}
BASE=${BASE:-}
if [ -n "$BASE" ]; then
    for s in $SEEDS; do
        [ -f "$BASE/s$s.json" ] || { echo "BASE=$BASE: no s$s.json there (run this script on the base checkpoint with the same SEEDS)" >&2; exit 2; }
    done
fi
[ -f "$CK/config.json" ] || { echo "CHECKPOINT=$CK: no model directory there (config.json is missing)" >&2; exit 2; }
mkdir -p "$OUT"
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

# ev NAME ARGS...: one kevin eval in the background, its JSON and log under OUT.
pids=()
ev() {
    local name=$1; shift
    # shellcheck disable=SC2086 # EXTRA is a list of arguments
    "$KEVIN" eval --checkpoint "$CK" --config "$CONFIG" --backend "$DEVICE" --device "$DEVICE" \
        --dir "$DIR" --json "$OUT/$name.json" "$@" $EXTRA > "$OUT/$name.log" 2>&1 &
    pids+=($!)
    names+=("$name")
}
# settle: waits for the evaluations started since the last settle; names a failed one.
settle() {
    local i failed=0
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            echo "kevin eval ${names[$i]} failed: see $OUT/${names[$i]}.log" >&2
            tail -n 5 "$OUT/${names[$i]}.log" >&2
            failed=1
        fi
    done
    pids=(); names=()
    return "$failed"
}

names=()
step "held-out ($DIR), $SAMPLES x $TURNS, seeds $SEEDS"
for s in $SEEDS; do ev "s$s" --samples "$SAMPLES" --turns "$TURNS" --seed "$s"; done
settle
if [ "$TABLE2" = 1 ]; then
    step "Table 2, 64 kernels a task, seeds $T2_SEEDS"
    for s in $T2_SEEDS; do
        ev "t2-16x4-s$s" --budget 64 --turns 4 --seed "$s"
        ev "t2-64x1-s$s" --budget 64 --turns 1 --seed "$s"
    done
    settle
fi
python3 - "$OUT"/*.json <<'PY'
import json, sys
from collections import defaultdict
for path in sys.argv[1:]:
    d = json.load(open(path))
    if "summary" not in d or "tasks" not in d:
        continue
    s = d["summary"]
    after_fail, after_ok = defaultdict(lambda: [0, 0]), [0, 0]
    # Files written since 2026-12-07 mark a turn that resubmits an earlier kernel.
    resubmitted = 0 if all("repeat" in r for t in d["tasks"] for tr in t["trajectories"] for r in tr) else None
    for t in d["tasks"]:
        for traj in t["trajectories"]:
            for a, b in zip(traj, traj[1:]):
                c = after_ok if a["outcome"] == "correct" else after_fail[a["outcome"]]
                if c is after_ok and resubmitted is not None:
                    resubmitted += b["repeat"]
                c[0] += b["outcome"] == "correct"
                c[1] += 1
    rate = lambda c: c[0] / c[1] if c[1] else float("nan")
    fails = [sum(c[0] for c in after_fail.values()), sum(c[1] for c in after_fail.values())]
    kinds = " ".join(f"{k} {rate(c):.2f}/{c[1]}" for k, c in sorted(after_fail.items()))
    name = path.rsplit("/", 1)[-1][:-5]
    line = (f"{name}: {d['samples']} x {d['turns']} seed {d['seed']}: avg@K {100 * s['avg_at_k']:.1f}% "
            f"best@K {100 * s['best_at_k']:.1f}% turn-1 {100 * s['turn_correct'][0]:.1f}% "
            f"format {100 * s['format_error_rate']:.1f}% speedup best {s['mean_speedup']:.3f}x "
            f"trajectory {s['mean_avg_speedup']:.3f}x")
    if d["turns"] > 1 and "repeat_rate" in s:
        line += f"; repeats {100 * s['repeat_rate']:.1f}% of later turns"
    if d["turns"] > 1:
        line += (f"; next correct after a failure {rate(fails):.2f} ({kinds})" if fails[1]
                 else "; no failed turn before the last")
        line += f", after a correct one {rate(after_ok):.2f}" if after_ok[1] else ""
        if after_ok[1] and resubmitted is not None:
            line += f" ({100 * resubmitted / after_ok[1]:.0f}% of those turns resubmit a kernel)"
    print(line)
PY
if [ -n "$BASE" ]; then
    base_files=() new_files=()
    for s in $SEEDS; do base_files+=("$BASE/s$s.json"); new_files+=("$OUT/s$s.json"); done
    step "compared with $BASE"
    "$KEVIN" eval --base "$(IFS=,; echo "${base_files[*]}")" --new "$(IFS=,; echo "${new_files[*]}")" \
        --json "$OUT/compare.json"
fi
