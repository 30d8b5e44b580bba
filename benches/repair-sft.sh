#!/usr/bin/env bash
# One round of repair fine-tuning on the policy's own turns (issue 19), as
# `benches/results/repair-sft-h100-2026-12-07.md` ran it (models/kevin-rl-gen3-repair-4m): the
# repair pairs `kevin sft repairs` builds from an RL run's episodes (a failed turn, the prompt the
# rollout built over it with the real feedback, and the fastest kernel the policy got right for
# that task), COPIES times, after corpus v3, and one epoch of `kevin sft train` from INIT. A form
# of expert iteration: the answers are the policy's own kernels that the environment judged
# correct, on training tasks only (`kevin sft repairs` refuses a held-out task's turn). Then, with
# EVAL=1, the held-out split at 16 x 8 on seeds 0 and 1, and Table 2 (16 x 4 against 64 x 1 at 64
# kernels a task) on seed 0.
#
#   KEVIN=target/release/kevin OUT=runs/repair-sft bash benches/repair-sft.sh
#
# Knobs (environment): INIT (models/kevin-rl-gen3-4m, in git history since 2026-12-07:
# `git checkout dd6bdb7 -- models/kevin-rl-gen3-4m`), EPISODES (an RL run directory or episodes
# file, plain, .gz or .xz; default benches/data/rl-gen3-episodes.jsonl.xz, the episodes of the RL
# piece that made INIT; or a `kevin eval --split train --transcripts` file), ANSWERS (a corpus
# whose verified kernels answer the failures of tasks the policy never got right; none by
# default), SUITE (the task folders of the episodes' tasks, `:`-joined; tasks), PER_TASK (32 pairs
# a task at most), COPIES (3), EPOCHS (1), LR (2e-4), DEVICE (cuda), DTYPE (bf16; f32 on the CPU),
# EVAL (0), CONFIG (configs/gpu-burn.toml). `benches/expert-round.sh` runs it on its collection.
set -euo pipefail
KEVIN=${KEVIN:-target/release/kevin}
OUT=${OUT:-runs/repair-sft}
INIT=${INIT:-models/kevin-rl-gen3-4m}
EPISODES=${EPISODES:-benches/data/rl-gen3-episodes.jsonl.xz}
PER_TASK=${PER_TASK:-32}
COPIES=${COPIES:-3}
EPOCHS=${EPOCHS:-1}
LR=${LR:-2e-4}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
EVAL=${EVAL:-0}
CONFIG=${CONFIG:-configs/gpu-burn.toml}
ANSWERS=${ANSWERS:-}
SUITE=${SUITE:-tasks}
if [ ! -f "$INIT/config.json" ]; then
    echo "INIT=$INIT: no model directory there (config.json is missing)" >&2
    [ "$INIT" = models/kevin-rl-gen3-4m ] && \
        echo "kevin-rl-gen3-4m is in git history: git checkout dd6bdb7 -- models/kevin-rl-gen3-4m" >&2
    exit 2
fi
mkdir -p "$OUT"
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

# `kevin sft repairs` reads plain and gzip files and run directories; xz is unpacked here.
case "$EPISODES" in
    *.xz) xz -dc "$EPISODES" > "$OUT/episodes.jsonl"; EPISODES="$OUT/episodes.jsonl" ;;
esac
step "repairs from $EPISODES, at most $PER_TASK a task"
"$KEVIN" sft repairs --episodes "$EPISODES" --out "$OUT/repairs.jsonl" --per-task "$PER_TASK" \
    --dir "$SUITE" ${ANSWERS:+--answers "$ANSWERS"} --json "$OUT/repairs.json"
step "corpus: corpus v3, then the repairs $COPIES times"
{
    xz -dc benches/data/warmstart-v3/gen.jsonl.xz benches/data/warmstart-v3/hand.jsonl.xz
    for _ in $(seq "$COPIES"); do cat "$OUT/repairs.jsonl"; done
} > "$OUT/corpus.jsonl"
sha256sum "$OUT/corpus.jsonl" >&2
step "train: $EPOCHS epoch(s) from $INIT, lr $LR"
rm -rf "$OUT/model"
"$KEVIN" sft train --init "$INIT" --corpus "$OUT/corpus.jsonl" --tokenizer "$INIT/tokenizer.json" \
    --out "$OUT/model" --epochs "$EPOCHS" --lr "$LR" --max-len 4096 --device "$DEVICE" \
    --dtype "$DTYPE"
[ "$EVAL" = 1 ] || exit 0

KEVIN="$KEVIN" CONFIG="$CONFIG" TABLE2=1 bash benches/eval-heldout.sh "$OUT/model" "$OUT/eval"
