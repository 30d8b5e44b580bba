#!/usr/bin/env bash
# The generated-task warm start of issue 19, end to end: procedural tasks, a verified corpus over
# them and the hand-written train tasks, supervised training, and the held-out evaluation twice
# (two sampling seeds, for the spread). Every step is skipped when its output is already there,
# so a cut-off run resumes where it stopped.
#
#   KEVIN=target/release/kevin OUT=runs/warmstart-gen bash benches/warmstart-gen.sh
#
# Knobs (environment): COUNT (2000 tasks), SEED (1903, of the tasks), WORKERS (one per core,
# for the corpus's CPU workers), EPOCHS (3), MAX_LEN (4096: the evaluation's context, so the
# corpus's multi-turn chains train whole), SHAPE (extra `kevin sft train` flags, e.g.
# "--hidden 384 --layers 8 --heads 6 --intermediate 1152"), K and N (16 x 8, the paper's),
# EVAL_SEEDS ("0 1"), DEVICE (cuda), DTYPE (f32; bf16 trains on the tensor cores with f32 masters), FAMILIES (the generator's, comma-separated; default all
# six, convolutions included; kevin-sft-gen2-4m was built on
# "elementwise,reduce,row,matmul,transpose", the default of its time), NAMING (varied; fixed
# for a seed's tasks of before 2026-12-06, on which the committed corpus was built), SHAPES
# (composite; simple with NAMING=fixed for the programs of the committed corpus), SUMS (plain;
# any for a seed's programs before the plain-sums check of 2026-12-06 evening, corpus v3's too),
# DRAWS (the generator's input draws per check, 3; 1 for a seed's programs before 2026-12-07,
# corpus v3's too), KEEP_APART (task folders, `:`-joined, whose held-out programs the generated
# ones stay apart from besides the suite's 14: benches/data/measure-5151, the measurement split, by
# default; empty for a seed's programs of before 2026-12-07), CORPUS_FROM (a folder with gen.jsonl.xz, hand.jsonl.xz
# and their .json records, e.g. benches/data/warmstart: the committed corpus is used instead of
# building one; it predates the multi-turn chains and the generator's varied names). Needs a GPU for training and evaluation as configured; the corpus runs on the
# CPU backend and needs a C++ compiler.
set -euo pipefail
KEVIN=${KEVIN:-target/release/kevin}
OUT=${OUT:-runs/warmstart-gen}
COUNT=${COUNT:-2000}
SEED=${SEED:-1903}
WORKERS=${WORKERS:-$(nproc)}
EPOCHS=${EPOCHS:-3}
MAX_LEN=${MAX_LEN:-4096}
SHAPE=${SHAPE:-}
K=${K:-16}
N=${N:-8}
EVAL_SEEDS=${EVAL_SEEDS:-0 1}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-f32}
FAMILIES=${FAMILIES:-}
NAMING=${NAMING:-varied}
SHAPES=${SHAPES:-composite}
SUMS=${SUMS:-plain}
DRAWS=${DRAWS:-3}
KEEP_APART=${KEEP_APART-benches/data/measure-5151}
CONFIG=configs/gpu-burn.toml
mkdir -p "$OUT"
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

if [ -n "${CORPUS_FROM:-}" ]; then
    for part in gen hand; do
        if [ ! -e "$OUT/$part.json" ]; then
            xz -dc "$CORPUS_FROM/$part.jsonl.xz" > "$OUT/$part.jsonl"
            cp "$CORPUS_FROM/$part.json" "$OUT/$part.json"
        fi
    done
fi
if [ ! -e "$OUT/gen.json" ] && [ ! -e "$OUT/tasks/generated.json" ]; then
    step "tasks: $COUNT from seed $SEED"
    rm -rf "$OUT/tasks"
    "$KEVIN" tasks generate --dir "tasks${KEEP_APART:+:$KEEP_APART}" --count "$COUNT" --seed "$SEED" --naming "$NAMING" --shapes "$SHAPES" --sums "$SUMS" \
        --draws "$DRAWS" --out "$OUT/tasks" \
        ${FAMILIES:+--families "$FAMILIES"}
fi
# The prompts at the preset the evaluation uses (the config's); breakages capped per generated
# task (thousands of programs), every breakage of the 47 hand-written tasks.
for part in gen hand; do
    if [ ! -e "$OUT/$part.json" ]; then
        step "corpus: $part"
        if [ "$part" = gen ]; then
            set -- --dir "$OUT/tasks" --breakages-per-task 2
        else
            set -- --dir tasks
        fi
        "$KEVIN" sft corpus "$@" --config "$CONFIG" --seed 19 --workers "$WORKERS" \
            --out "$OUT/$part.jsonl" --json "$OUT/$part.json.part"
        mv "$OUT/$part.json.part" "$OUT/$part.json"
    fi
done
cat "$OUT/gen.jsonl" "$OUT/hand.jsonl" > "$OUT/all.jsonl"
if [ ! -e "$OUT/model/sft.json" ]; then
    step "sft: $EPOCHS epochs, $DTYPE $SHAPE"
    # shellcheck disable=SC2086 # SHAPE is a list of flags
    "$KEVIN" sft train --corpus "$OUT/all.jsonl" --tokenizer models/kevin-bpe-4096/tokenizer.json \
        --out "$OUT/model" --epochs "$EPOCHS" --max-len "$MAX_LEN" --device "$DEVICE" --dtype "$DTYPE" $SHAPE
fi
for s in $EVAL_SEEDS; do
    if [ ! -e "$OUT/eval-$s.json" ]; then
        step "held-out evaluation: $K x $N, seed $s"
        "$KEVIN" eval --checkpoint "$OUT/model" --config "$CONFIG" --samples "$K" --turns "$N" \
            --seed "$s" --backend "$DEVICE" --device "$DEVICE" \
            --json "$OUT/eval-$s.json.part" --transcripts "$OUT/turns-$s.jsonl"
        mv "$OUT/eval-$s.json.part" "$OUT/eval-$s.json"
    fi
done
step "done: $OUT"
