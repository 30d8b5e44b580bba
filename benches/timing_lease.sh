#!/usr/bin/env bash
# The timing-lease measurement of issue 17 (item 7): the reference solutions' speedups on the GPU
# idle, then while `kevin bench policy` generates on the same GPU, with the timing lease (the
# default, env.timing = "exclusive") and, for contrast, without it (--timing shared).
#
#   KEVIN_BIN=target/release/kevin OUT=/tmp/out benches/timing_lease.sh
#
# Runs from the repository root, on a machine with a GPU. Steps (about 5-8 minutes on an H200
# with a warm cubecl cache, see below):
#   1. `kevin eval --kernels tasks/solutions --backend cuda` REPEAT times on the idle GPU;
#   2. starts the load: `kevin bench policy --device cuda --dtype bf16 --batches 64
#      --train-steps 0 --load-seconds ...` (Qwen2-0.5B shape, 64 sequences decoding; its steps
#      honour the lease), and waits until it generates (its "load:" line);
#   3. the same eval REPEAT times with the lease, then once with --timing shared (no lease);
#   4. stops the load, and runs the idle eval REPEAT times again (the idle noise floor: first
#      idle runs against the second);
#   5. compares per task the median speedup (and baseline and kernel times) of each loaded
#      mode with the median of all idle runs, and the two idle halves with each other.
# Writes $OUT/timing_lease.md and $OUT/timing_lease.json, the raw eval JSONs and the load's
# log. Exit status 0 when every task's leased speedup is within TOLERANCE of idle, else 1.
#
# Settings (environment): KEVIN_BIN (default target/release/kevin), OUT (default
# ./timing-lease-out), REPEAT (3), TOLERANCE (0.03), TASKS (comma-separated subset; default
# all), LOAD_ARGS (extra `kevin bench policy` flags, e.g. "--train-steps 1" to add learner
# steps to the load), LOAD_START_S (how long to wait for the load to start generating: 400;
# the first run on a machine compiles burn's kernels, later runs read cubecl's cache).
set -euo pipefail

KEVIN_BIN=${KEVIN_BIN:-target/release/kevin}
OUT=${OUT:-./timing-lease-out}
REPEAT=${REPEAT:-3}
TOLERANCE=${TOLERANCE:-0.03}
TASKS=${TASKS:-}
LOAD_ARGS=${LOAD_ARGS:-}
LOAD_START_S=${LOAD_START_S:-400}

mkdir -p "$OUT"
[ -x "$KEVIN_BIN" ] || { echo "timing_lease.sh: KEVIN_BIN=$KEVIN_BIN is not an executable" >&2; exit 2; }
command -v python3 >/dev/null || { echo "timing_lease.sh: needs python3 for the comparison" >&2; exit 2; }

task_flags=()
[ -n "$TASKS" ] && task_flags=(--tasks "$TASKS")

started=$(date +%s)
log() { echo "[timing_lease $(( $(date +%s) - started )) s] $*" >&2; }

# eval NAME [flags...]: one `kevin eval` of the reference solutions into $OUT/NAME.json.
eval_run() {
    local name=$1
    shift
    log "eval $name $*"
    "$KEVIN_BIN" eval --kernels tasks/solutions --backend cuda "${task_flags[@]}" \
        --json "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err" \
        || { log "eval $name failed:"; tail -5 "$OUT/$name.err" >&2; exit 1; }
}

load_pid=
stop_load() {
    if [ -n "$load_pid" ] && kill -0 "$load_pid" 2>/dev/null; then
        kill -TERM "$load_pid" 2>/dev/null || true
        wait "$load_pid" 2>/dev/null || true
    fi
    load_pid=
}
trap stop_load EXIT

for i in $(seq 1 "$REPEAT"); do eval_run "idle-a$i"; done

log "starting the load: kevin bench policy --device cuda --dtype bf16 --batches 64 --train-steps 0 $LOAD_ARGS"
# shellcheck disable=SC2086
"$KEVIN_BIN" bench policy --device cuda --dtype bf16 --batches 64 --train-steps 0 \
    --load-seconds 3600 $LOAD_ARGS >"$OUT/load.out" 2>"$OUT/load.err" &
load_pid=$!
waited=0
until grep -q "^load: generating" "$OUT/load.err" 2>/dev/null; do
    if ! kill -0 "$load_pid" 2>/dev/null; then
        log "the load exited before generating:"; tail -5 "$OUT/load.err" >&2; exit 1
    fi
    if [ "$waited" -ge "$LOAD_START_S" ]; then
        log "the load did not start generating within $LOAD_START_S s"; exit 1
    fi
    sleep 2
    waited=$((waited + 2))
done
sleep 5 # into steady decoding
log "the load generates"

for i in $(seq 1 "$REPEAT"); do eval_run "leased$i"; done
eval_run "shared1" --timing shared
grep "^load:" "$OUT/load.err" | tail -1 >&2 || true
stop_load
log "load stopped"

for i in $(seq 1 "$REPEAT"); do eval_run "idle-b$i"; done

python3 benches/timing_lease_compare.py "$OUT" "$REPEAT" "$TOLERANCE"
