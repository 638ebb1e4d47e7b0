#!/usr/bin/env bash
# kv_decode_cpu.sh: CPU prompt and decode speed of every KV cache kind on one model, each against
# f16 KV measured in the same run (docs/kv-baselines.md "CPU decode speed by KV kind").
#   f16, q8_0, q4_0, q4_0 + --kv-rot hadamard (free), then the forge's artifacts: kv-int8 (ec-rot),
#   kv-rq at 2.5 bits, kv-dict (256 x 8 f16; learned with a loose gate so that it is written)
# Each row: `qforge generate -n N -c CTX -t T --temp 0` after a prompt of the demo corpus' first
# PROMPT_BYTES bytes, REPEAT runs in turn (median). The artifacts are calibrated once at -c 512
# into WORK and run at CTX with --force-uncertified-ctx (a speed measurement, not a quality one).
# QF_BASE=path/to/other/qforge adds its median beside each row, run in alternation (before/after).
#
#   bench/kv_decode_cpu.sh            (defaults: the 27m hd128 model of ../shared, CTX 2048, N 128,
#                                      T 2, REPEAT 3, PROMPT_BYTES 5300: a 1619-token prompt)
set -euo pipefail
cd "$(dirname "$0")/.."
QF=${QF:-build/qforge}
T=${T:-2} N=${N:-128} CTX=${CTX:-2048} REPEAT=${REPEAT:-3} PROMPT_BYTES=${PROMPT_BYTES:-5300}
WORK=${WORK:-/tmp/qf-kv-decode}
DATA=${DATA:-../shared/data}
MODEL=${MODEL:-$DATA/models/qforge-demo-27m-hd128-f16.gguf}
if [ ! -f "$MODEL" ]; then # a fresh clone without ../shared: the embedded model at its context
    MODEL=assets/models/qforge-demo-11m-f16.gguf CTX=${CTX_11M:-512} PROMPT_BYTES=${PROMPT_BYTES_11M:-1300}
fi
[ -x "$QF" ] || make -j"$(nproc)" cli >/dev/null
mkdir -p "$WORK"
case "$(cd "$WORK" && pwd)/" in "$(pwd)"/*) echo "kv_decode_cpu: WORK must be outside the repository" >&2; exit 2 ;; esac
tag=$(basename "$MODEL" .gguf)
PROMPT=$(head -c "$PROMPT_BYTES" assets/corpora/kerneldoc-demo/docs.txt)
LOOSE=(--gate 100 --max-kld 10 --max-kld-p99 100 --allow-worse-than-baseline)
art() { # the artifact of a kind, made once
    local f="$WORK/$tag-$1.qfa"
    if [ ! -s "$f" ]; then
        case "$1" in
        kv-int8) "$QF" calibrate -m "$MODEL" --artifact kv-int8 -c 512 --eval-chunks 1 -t "$T" -o "$f" ;;
        kv-rq) "$QF" calibrate -m "$MODEL" --artifact kv-rq --bits 2.5 -c 512 --eval-chunks 1 --sens-chunks 1 -t "$T" -o "$f" ;;
        kv-dict) "$QF" calibrate -m "$MODEL" --artifact kv-dict -c 512 --eval-chunks 1 -t "$T" "${LOOSE[@]}" -o "$f" ;;
        esac >"$WORK/$tag-$1.log" 2>&1 || { echo "kv_decode_cpu: calibrate $1 failed (see $WORK/$tag-$1.log)" >&2; exit 1; }
    fi
    echo "$f"
}
# one run: "prompt_tok_s decode_tok_s"
one() {
    local bin=$1
    shift
    "$bin" generate -m "$MODEL" -p "$PROMPT" -n "$N" -c "$CTX" -t "$T" --temp 0 --device cpu "$@" 2>&1 >/dev/null |
        sed -n 's/.*prompt [0-9]* tokens in [0-9.]* s (\([0-9.]*\) t\/s), generated [0-9]* tokens in [0-9.]* s (\([0-9.]*\) t\/s).*/\1 \2/p'
}
median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
declare -A ARGS
ARGS[f16]="-ctk f16 -ctv f16"
ARGS[q8_0]="-ctk q8_0 -ctv q8_0"
ARGS[q4_0]="-ctk q4_0 -ctv q4_0"
ARGS[q4_0+hadamard]="-ctk q4_0 -ctv q4_0 --kv-rot hadamard"
for k in kv-int8 kv-rq kv-dict; do ARGS[$k]="--artifact $(art $k) --force-uncertified-ctx"; done
KINDS=(f16 q8_0 q4_0 q4_0+hadamard kv-int8 kv-rq kv-dict)
echo "$(basename "$MODEL"), -c $CTX, -t $T, a $(printf '%s' "$PROMPT" | wc -c)-byte prompt, $N tokens, median of $REPEAT ($QF${QF_BASE:+ and $QF_BASE})"
if [ -n "${QF_BASE:-}" ]; then
    echo "| KV | prompt tok/s | decode tok/s | decode / f16 KV | base: prompt | base: decode | decode / base |"
    echo "|---|---|---|---|---|---|---|"
else
    echo "| KV | prompt tok/s | decode tok/s | decode / f16 KV |"
    echo "|---|---|---|---|"
fi
f16dec=""
for k in "${KINDS[@]}"; do
    read -r -a a <<<"${ARGS[$k]}"
    : >"$WORK/p.txt"; : >"$WORK/d.txt"; : >"$WORK/bp.txt"; : >"$WORK/bd.txt"
    for _ in $(seq "$REPEAT"); do
        read -r p d <<<"$(one "$QF" "${a[@]}")"
        echo "$p" >>"$WORK/p.txt"; echo "$d" >>"$WORK/d.txt"
        if [ -n "${QF_BASE:-}" ]; then
            read -r p d <<<"$(QF_ASSETS_DIR=$(pwd)/assets one "$QF_BASE" "${a[@]}")"
            echo "$p" >>"$WORK/bp.txt"; echo "$d" >>"$WORK/bd.txt"
        fi
    done
    P=$(median <"$WORK/p.txt"); D=$(median <"$WORK/d.txt")
    [ -z "$f16dec" ] && f16dec=$D
    R=$(awk -v a="$D" -v b="$f16dec" 'BEGIN {printf "%.2f", a / b}')
    if [ -n "${QF_BASE:-}" ]; then
        BP=$(median <"$WORK/bp.txt"); BD=$(median <"$WORK/bd.txt")
        echo "| $k | $P | $D | $R | $BP | $BD | $(awk -v a="$D" -v b="$BD" 'BEGIN {printf "%.2f", a / b}') |"
    else
        echo "| $k | $P | $D | $R |"
    fi
done
