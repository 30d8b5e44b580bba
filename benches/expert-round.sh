#!/usr/bin/env bash
# One round of expert iteration on programs the policy has never seen (issue 19), as
# `benches/results/expert-round-2026-12-07.md` ran it: COUNT fresh generated training programs
# (kept apart from the measurement split), a verified corpus kernel for each of them (the CPU
# backend), the policy's own K x N turns on them (`kevin eval --split train --transcripts`: the
# evaluation's speed, no learner), repair pairs from those turns (`kevin sft repairs`: each failed
# turn with the prompt the rollout built over it and its real feedback, answered by the fastest
# kernel the policy itself got right for that program, else by the corpus's), and one epoch of
# `kevin sft train` from INIT on corpus v3 and the pairs COPIES times. With EVAL=1, the
# measurement split at 4 x 4 on seeds 0 and 1 (`benches/eval-heldout.sh`). Every step is skipped
# when its output is there, so a cut-off round resumes.
#
#   KEVIN=target/release/kevin OUT=runs/expert-round bash benches/expert-round.sh
#
# Knobs (environment): INIT (models/kevin-rl-gen3-repair-4m), COUNT (480), SEED (4242, of the
# programs), K and N (4 x 4, the collection's trajectories and turns), COLLECT_SEED (7), PER_TASK
# (32 pairs a program at most), COPIES (1), EPOCHS (1), LR (2e-4), WORKERS (one per core, the
# corpus's CPU workers), DEVICE (cuda), DTYPE (bf16), KEEP_APART (benches/data/measure-5151),
# EVAL (0), CONFIG (configs/gpu-burn.toml). The corpus step needs a C++ compiler (and NVRTC, which
# the CPU backend runs first where it is installed); collection and training need a GPU as
# configured.
set -euo pipefail
KEVIN=${KEVIN:-target/release/kevin}
OUT=${OUT:-runs/expert-round}
INIT=${INIT:-models/kevin-rl-gen3-repair-4m}
COUNT=${COUNT:-480}
SEED=${SEED:-4242}
K=${K:-4}
N=${N:-4}
COLLECT_SEED=${COLLECT_SEED:-7}
PER_TASK=${PER_TASK:-32}
COPIES=${COPIES:-1}
EPOCHS=${EPOCHS:-1}
LR=${LR:-2e-4}
WORKERS=${WORKERS:-$(nproc)}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
KEEP_APART=${KEEP_APART-benches/data/measure-5151}
EVAL=${EVAL:-0}
CONFIG=${CONFIG:-configs/gpu-burn.toml}
mkdir -p "$OUT"
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

if [ ! -e "$OUT/tasks/generated.json" ]; then
    step "programs: $COUNT from seed $SEED, apart from the held-out tasks${KEEP_APART:+ and $KEEP_APART}"
    rm -rf "$OUT/tasks"
    "$KEVIN" tasks generate --dir "tasks${KEEP_APART:+:$KEEP_APART}" --count "$COUNT" --seed "$SEED" \
        --out "$OUT/tasks"
fi
if [ ! -e "$OUT/answers.json" ]; then
    step "corpus kernels of the programs (CPU backend, $WORKERS workers)"
    "$KEVIN" sft corpus --dir "$OUT/tasks" --breakages-per-task 0 --chains-per-task 0 \
        --config "$CONFIG" --seed 19 --workers "$WORKERS" --out "$OUT/answers.jsonl" \
        --json "$OUT/answers.json.part"
    mv "$OUT/answers.json.part" "$OUT/answers.json"
fi
if [ ! -e "$OUT/collect.json" ]; then
    step "the policy's own turns: $K x $N on each program"
    "$KEVIN" eval --checkpoint "$INIT" --config "$CONFIG" --dir "$OUT/tasks" --split train \
        --samples "$K" --turns "$N" --seed "$COLLECT_SEED" --backend "$DEVICE" --device "$DEVICE" \
        --transcripts "$OUT/turns.jsonl" --json "$OUT/collect.json.part" > "$OUT/collect.log"
    mv "$OUT/collect.json.part" "$OUT/collect.json"
fi
# Pairs, corpus v3 then the pairs COPIES times, and the training: benches/repair-sft.sh's round.
if [ ! -e "$OUT/model/sft.json" ]; then
    KEVIN="$KEVIN" OUT="$OUT" INIT="$INIT" EPISODES="$OUT/turns.jsonl" ANSWERS="$OUT/answers.jsonl" \
        SUITE="$OUT/tasks${KEEP_APART:+:$KEEP_APART}:tasks" PER_TASK="$PER_TASK" COPIES="$COPIES" \
        EPOCHS="$EPOCHS" LR="$LR" DEVICE="$DEVICE" DTYPE="$DTYPE" EVAL=0 CONFIG="$CONFIG" \
        bash benches/repair-sft.sh
fi
[ "$EVAL" = 1 ] || exit 0
KEVIN="$KEVIN" CONFIG="$CONFIG" DIR="${KEEP_APART:-tasks}" SAMPLES=4 TURNS=4 \
    bash benches/eval-heldout.sh "$OUT/model" "$OUT/eval"
