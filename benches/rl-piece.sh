#!/usr/bin/env bash
# One RL piece of issue 19 on the GPU, as `benches/results/rl-gen3-h100-2026-12-06.md` ran it
# (models/kevin-rl-gen3-4m, in git history since 2026-12-07): from a committed warm start, on the hand-written training tasks and
# 240 generated ones, 8 trajectories x 4 turns, 8 tasks a step, lr 3e-5, until STEPS learner steps
# (or SIGINT after MAX_S seconds, which checkpoints and stops cleanly). By default the 240 are
# programs the warm start never saw (TASKS=fresh); TASKS=seen draws them from the warm start's own
# corpus tasks with Python's random.Random(DRAW) over the sorted file names, as the pieces of
# 2026-12-04/05 did (`rl-h200-2026-12-04b.md`, `rl-2026-12-05.md`).
#
#   KEVIN=target/release/kevin OUT=runs/rl-piece bash benches/rl-piece.sh
#
# Knobs (environment): GEN (gen3: the 1,500 tasks of corpus v3, `kevin tasks generate --count
# 1500 --seed 2612 --sums any` (the defaults of that day), and the warm start models/kevin-sft-gen3-4m;
# gen2: the 2,000 of corpus v2, seed 1903 with the five families, fixed names and simple shapes of
# that time, and models/kevin-sft-gen2-4m, as the 2026-12-04/05 pieces ran; it left the repository
# on 2026-12-07: `git checkout cab7947 -- models/kevin-sft-gen2-4m`), INIT (the warm start
# GEN names), TASKS (seen: 240 of the warm start's own corpus tasks, as the pieces of 2026-12-04/05
# trained, with STEPS=25; fresh: 240 tasks the warm start never saw, `kevin tasks generate --dir
# tasks:GEN-TASKS --count 240 --seed FRESH_SEED` with the generator's defaults of the day, none of
# them a program of the warm start's corpus, so that RL rewards kernels for programs new to the
# policy, as the held-out split asks; the default), FRESH_SEED (7001), FRESH_DRAWS (1: the
# generator's one input draw per check of the day the 240 were first drawn; 3, the generator's
# default since 2026-12-07, draws other tasks), STEPS (30), MAX_S
# (520), DRAW (19), LR (3e-5), CONFIG (configs/gpu-burn.toml), EVAL (0). A folder $OUT/gen240 made
# beforehand (e.g. on a machine with more time) is used as it is. With EVAL=1 the newest
# checkpoint is then evaluated on the held-out split (`benches/eval-heldout.sh`: 16 x 8 on seeds 0
# and 1 for the spread, and with TABLE2=1 Table 2 too) into $OUT/eval. The replay's credit is the
# config's (`"score"`); `KEVIN__REPLAY__CREDIT=improvement` in the environment passes through.
# PRIOR=1 first evaluates INIT on the run's tasks (the 240 and the hand-written train split, 4 x 4,
# seed 7; kept in $OUT/prior-*.json, so later pieces reuse them) and starts the sampler from its
# correct-turn rates (`tasks.prior`), with FLOOR (0.02 then; the config's 0.1 otherwise) as the
# weight of a task always or never solved: without it, 61% of a step's groups were flat
# (`benches/results/rl-prior-h100-2026-12-07.md`).
set -euo pipefail
KEVIN=${KEVIN:-target/release/kevin}
OUT=${OUT:-runs/rl-piece}
GEN=${GEN:-gen3}
case "$GEN" in
    gen3) GEN_ARGS=(--count 1500 --seed 2612 --sums any --draws 1); INIT=${INIT:-models/kevin-sft-gen3-4m} ;;
    gen2) GEN_ARGS=(--count 2000 --seed 1903 --naming fixed --shapes simple --sums any --draws 1
                    --families elementwise,reduce,row,matmul,transpose)
          INIT=${INIT:-models/kevin-sft-gen2-4m} ;;
    *) echo "GEN=$GEN: gen3 or gen2" >&2; exit 2 ;;
esac
if [ ! -f "$INIT/config.json" ]; then
    echo "INIT=$INIT: no model directory there (config.json is missing)" >&2
    [ "$GEN" = gen2 ] && echo "kevin-sft-gen2-4m is in git history: git checkout cab7947 -- models/kevin-sft-gen2-4m" >&2
    exit 2
fi
TASKS=${TASKS:-fresh}
FRESH_SEED=${FRESH_SEED:-7001}
FRESH_DRAWS=${FRESH_DRAWS:-1}
case "$TASKS" in seen|fresh) ;; *) echo "TASKS=$TASKS: seen or fresh" >&2; exit 2 ;; esac
STEPS=${STEPS:-30}
MAX_S=${MAX_S:-520}
DRAW=${DRAW:-19}
LR=${LR:-3e-5}
CONFIG=${CONFIG:-configs/gpu-burn.toml}
PRIOR=${PRIOR:-0}
case "$PRIOR" in 0|1) ;; *) echo "PRIOR=$PRIOR: 0 or 1" >&2; exit 2 ;; esac
FLOOR=${FLOOR:-$([ "$PRIOR" = 1 ] && echo 0.02)}
mkdir -p "$OUT"
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

if [ ! -d "$OUT/gen240" ]; then
    step "tasks: the warm start's (${GEN_ARGS[*]}), then 240 $TASKS ones"
    rm -rf "$OUT/gen-all" "$OUT/gen240.part"
    # The tasks of the warm start's corpus (GEN), so that the pieces of one run keep the same ones.
    "$KEVIN" tasks generate "${GEN_ARGS[@]}" --out "$OUT/gen-all" > "$OUT/generate.log"
    if [ "$TASKS" = fresh ]; then
        # `--dir` names the warm start's tasks too: the generator refuses their programs as
        # duplicates.
        "$KEVIN" tasks generate --dir "tasks:$OUT/gen-all" --count 240 --seed "$FRESH_SEED" \
            --draws "$FRESH_DRAWS" --out "$OUT/gen240.part" >> "$OUT/generate.log"
    else
        # 240 of them drawn with random.Random(DRAW) over the sorted file names.
        mkdir -p "$OUT/gen240.part"
        python3 - "$OUT/gen-all" "$OUT/gen240.part" "$DRAW" <<'EOF'
import os, random, shutil, sys
src, dst, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = sorted(n for n in os.listdir(src) if n.endswith(".toml"))
for n in random.Random(seed).sample(names, 240):
    shutil.copy(os.path.join(src, n), os.path.join(dst, n))
EOF
    fi
    mv "$OUT/gen240.part" "$OUT/gen240"
fi

if [ "$PRIOR" = 1 ]; then
    for part in gen hand; do
        [ -f "$OUT/prior-$part.json" ] && continue
        step "prior: $INIT on the $part tasks, 4 x 4, seed 7"
        dir=$([ "$part" = gen ] && echo "$OUT/gen240" || echo tasks)
        "$KEVIN" eval --checkpoint "$INIT" --config "$CONFIG" --dir "$dir" --split train \
            --samples 4 --turns 4 --seed 7 --backend cuda --device cuda \
            --json "$OUT/prior-$part.json.part" > "$OUT/prior-$part.log" 2>&1 \
            && mv "$OUT/prior-$part.json.part" "$OUT/prior-$part.json" &
    done
    wait
    for part in gen hand; do
        [ -f "$OUT/prior-$part.json" ] || { echo "prior: the $part evaluation failed ($OUT/prior-$part.log)" >&2; exit 1; }
    done
    export KEVIN__TASKS__PRIOR="$OUT/prior-gen.json:$OUT/prior-hand.json"
fi
if [ -n "$FLOOR" ]; then
    export KEVIN__TASKS__FLOOR="$FLOOR"
fi

step "train: $STEPS steps from $INIT (SIGINT after $MAX_S s at most)"
KEVIN__POLICY__BURN__CHECKPOINT="$INIT" KEVIN__TASKS__DIR="tasks:$OUT/gen240" \
KEVIN__ROLLOUT__TURNS=4 KEVIN__REPLAY__TASKS_PER_BATCH=8 KEVIN__ROLLOUT__MAX_INFLIGHT_GROUPS=16 \
KEVIN__LEARNER__LR="$LR" \
    "$KEVIN" train --config "$CONFIG" --run-dir "$OUT/run" --max-steps "$STEPS" > "$OUT/train.log" 2>&1 &
pid=$!
start=$(date +%s)
while kill -0 "$pid" 2>/dev/null; do
    if [ $(( $(date +%s) - start )) -ge "$MAX_S" ]; then
        step "SIGINT after $MAX_S s"
        kill -INT "$pid"
        break
    fi
    sleep 2
done
rc=0
wait "$pid" || rc=$?
step "train exited $rc after $(( $(date +%s) - start )) s"
ls "$OUT/run/checkpoints" >&2
if [ "$rc" = 0 ] && [ "${EVAL:-0}" = 1 ]; then
    newest=$(ls -d "$OUT"/run/checkpoints/step-* | sort | tail -n 1)
    step "held-out evaluation of $newest"
    KEVIN="$KEVIN" CONFIG="$CONFIG" bash benches/eval-heldout.sh "$newest/learner" "$OUT/eval"
fi
exit "$rc"
