#!/usr/bin/env bash
# llamacpp_ref.sh - rerun the llama.cpp reference measurements (perplexity, KLD,
# KV-cache quantization, throughput, tokenizer) that docs/parity-llamacpp.md records.
#
# This script does NOT download or build llama.cpp. Point LLAMA_CPP_DIR at an
# existing llama.cpp checkout that has already been built (binaries in
# $LLAMA_CPP_DIR/build/bin, or $LLAMA_CPP_DIR/bin).
#
# Usage:
#   LLAMA_CPP_DIR=/path/to/llama.cpp bench/llamacpp_ref.sh [section ...]
# Sections (default: all, in this order):
#   ppl       perplexity table (every model x corpus at -c 512, a subset at -c 256)
#   quant     llama-quantize q4_0 / q8_0 from the demo f16, and their perplexity
#   kvq       quantized KV cache (q8_0, q4_0) on demo f16 / kerneldoc / -c 512
#   kld       KL-divergence base file from demo f16, KLD of q8_0 / q4_k_m / q4_0
#   speed     throughput (-t 2 -c 512 -b 512) on kerneldoc, wall time
#   tok       llama-tokenize --ids reference strings
#   summary   print a TSV summary of all ppl-*.log files in $REF_OUT
# Environment:
#   LLAMA_CPP_DIR  (required) llama.cpp tree with built binaries
#   QFORGE_DATA    test data dir (default: <repo>/../shared/data, else /work/shared/data)
#   REF_OUT        where logs and generated files go (default /work/ref; keep it
#                  outside the repository)
#   THREADS        threads for llama.cpp (default 2)
#   BIG_CHUNKS     --chunks for the large corpora (default 40; kerneldoc included: its
#                  full 403-chunk run is done once, for the demo f16, as ppl-...-full)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
: "${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to an existing, already built llama.cpp tree}"
if [ -x "$LLAMA_CPP_DIR/build/bin/llama-perplexity" ]; then
    BIN=$LLAMA_CPP_DIR/build/bin
elif [ -x "$LLAMA_CPP_DIR/bin/llama-perplexity" ]; then
    BIN=$LLAMA_CPP_DIR/bin
else
    echo "llamacpp_ref.sh: no llama-perplexity under $LLAMA_CPP_DIR/build/bin or $LLAMA_CPP_DIR/bin" >&2
    exit 2
fi
if [ -z "${QFORGE_DATA:-}" ]; then
    if [ -d "$here/../shared/data" ]; then QFORGE_DATA=$here/../shared/data; else QFORGE_DATA=/work/shared/data; fi
fi
REF_OUT=${REF_OUT:-/work/ref}
THREADS=${THREADS:-2}
BIG_CHUNKS=${BIG_CHUNKS:-40}
M=$QFORGE_DATA/models
C=$QFORGE_DATA/corpora
mkdir -p "$REF_OUT"
case "$(cd "$REF_OUT" && pwd)/" in
    "$here"/*) echo "llamacpp_ref.sh: REF_OUT must be outside the repository" >&2; exit 2 ;;
esac

models="qforge-demo-11m-f16 qforge-demo-11m-q8_0 qforge-demo-11m-q4_k_m qforge-demo-qwen2-5m-f16
        qforge-demo-qwen2-5m-q4_k_m qforge-demo-11m-4k-f16 stories260K"
# corpus-name:path:chunks  (chunks "all" = no --chunks flag)
corpora="kerneldoc:$C/kerneldoc-demo/docs.txt:$BIG_CHUNKS
         wikitext2test:$C/wikitext-2-raw-test.txt:$BIG_CHUNKS
         tsvalidhead:$C/tinystories-valid-head.txt:$BIG_CHUNKS
         tinyshakespeare:$C/tinyshakespeare.txt:$BIG_CHUNKS
         cs336sample:$C/tinystories-sample-cs336.txt:all"

# ppl MODELFILE CORPUSFILE CTX CHUNKS LOGNAME [extra llama-perplexity args...]
# The batch size is set equal to the context (-b CTX) so that llama-perplexity
# evaluates exactly one chunk per decode (n_seq = 1, KV cache of exactly CTX cells).
ppl() {
    local model=$1 corpus=$2 ctx=$3 chunks=$4 log=$5; shift 5
    local ch=()
    [ "$chunks" = all ] || ch=(--chunks "$chunks")
    local t0 t1
    t0=$(date +%s.%N)
    "$BIN/llama-perplexity" -m "$model" -f "$corpus" -t "$THREADS" -c "$ctx" -b "$ctx" \
        "${ch[@]}" "$@" > "$REF_OUT/$log" 2>&1 || echo "  (exit $? - see $log)"
    t1=$(date +%s.%N)
    echo "wall_seconds $(echo "$t1 - $t0" | bc)" >> "$REF_OUT/$log"
    printf '%-60s %s\n' "$log" "$(grep -o 'Final estimate.*' "$REF_OUT/$log" || grep -m1 -o 'you need at least.*' "$REF_OUT/$log" || echo '?')"
}

sec_ppl() {
    for m in $models; do
        for cc in $corpora; do
            IFS=: read -r cname cpath chunks <<< "$cc"
            ppl "$M/$m.gguf" "$cpath" 512 "$chunks" "ppl-$m-$cname-c512.log"
        done
    done
    # the whole kerneldoc corpus (403 chunks at -c 512) for the demo f16 only
    ppl "$M/qforge-demo-11m-f16.gguf" "$C/kerneldoc-demo/docs.txt" 512 all "ppl-qforge-demo-11m-f16-kerneldoc-c512-full.log"
    # -c 256 subset
    for m in qforge-demo-11m-f16 qforge-demo-qwen2-5m-f16 stories260K; do
        for cc in $corpora; do
            IFS=: read -r cname cpath chunks <<< "$cc"
            case $cname in kerneldoc|wikitext2test|cs336sample) ;; *) continue ;; esac
            ppl "$M/$m.gguf" "$cpath" 256 "$chunks" "ppl-$m-$cname-c256.log"
        done
    done
}

sec_quant() {
    for q in q4_0 q8_0; do
        "$BIN/llama-quantize" "$M/qforge-demo-11m-f16.gguf" "$REF_OUT/qforge-demo-11m-$q.gguf" "$q" "$THREADS" \
            > "$REF_OUT/quantize-$q.log" 2>&1
        sha256sum "$REF_OUT/qforge-demo-11m-$q.gguf"
        for cc in $corpora; do
            IFS=: read -r cname cpath chunks <<< "$cc"
            case $cname in kerneldoc|wikitext2test) ;; *) continue ;; esac
            ppl "$REF_OUT/qforge-demo-11m-$q.gguf" "$cpath" 512 "$chunks" "ppl-ref-qforge-demo-11m-$q-$cname-c512.log"
        done
    done
}

sec_kvq() {
    local f16=$M/qforge-demo-11m-f16.gguf kd=$C/kerneldoc-demo/docs.txt
    ppl "$f16" "$kd" 512 "$BIG_CHUNKS" "kvq-f16-fa0.log"
    ppl "$f16" "$kd" 512 "$BIG_CHUNKS" "kvq-f16-fa1.log" -fa
    ppl "$f16" "$kd" 512 "$BIG_CHUNKS" "kvq-q8_0-fa0.log" -ctk q8_0 -ctv q8_0
    ppl "$f16" "$kd" 512 "$BIG_CHUNKS" "kvq-q8_0-fa1.log" -ctk q8_0 -ctv q8_0 -fa
    ppl "$f16" "$kd" 512 "$BIG_CHUNKS" "kvq-q4_0-fa1.log" -ctk q4_0 -ctv q4_0 -fa
    ppl "$f16" "$kd" 512 "$BIG_CHUNKS" "kvq-k-q8_0-fa0.log" -ctk q8_0
    ppl "$f16" "$kd" 512 "$BIG_CHUNKS" "kvq-k-q4_0-fa0.log" -ctk q4_0
}

sec_kld() {
    local kd=$C/kerneldoc-demo/docs.txt base=$REF_OUT/demo-f16-kerneldoc.kld
    ppl "$M/qforge-demo-11m-f16.gguf" "$kd" 512 "$BIG_CHUNKS" "kld-base-demo-f16-kerneldoc.log" --kl-divergence-base "$base"
    sha256sum "$base"
    ppl "$M/qforge-demo-11m-f16.gguf" "$kd" 512 "$BIG_CHUNKS" "kld-f16-vs-base.log" --kl-divergence-base "$base" --kl-divergence
    for q in q8_0 q4_k_m; do
        ppl "$M/qforge-demo-11m-$q.gguf" "$kd" 512 "$BIG_CHUNKS" "kld-$q-vs-f16.log" --kl-divergence-base "$base" --kl-divergence
    done
    if [ -f "$REF_OUT/qforge-demo-11m-q4_0.gguf" ]; then
        ppl "$REF_OUT/qforge-demo-11m-q4_0.gguf" "$kd" 512 "$BIG_CHUNKS" "kld-q4_0-vs-f16.log" --kl-divergence-base "$base" --kl-divergence
    fi
}

sec_speed() {
    local kd=$C/kerneldoc-demo/docs.txt
    for m in "$M/qforge-demo-11m-f16.gguf" "$M/qforge-demo-11m-q8_0.gguf" "$REF_OUT/qforge-demo-11m-q4_0.gguf" \
             "$M/qforge-demo-11m-q4_k_m.gguf"; do
        [ -f "$m" ] || continue
        n=$(basename "$m" .gguf)
        ppl "$m" "$kd" 512 "$BIG_CHUNKS" "speed-$n-kerneldoc.log"
        grep -E 'prompt eval time|total time|wall_seconds' "$REF_OUT/speed-$n-kerneldoc.log"
    done
}

sec_tok() {
    local out=$REF_OUT/tokenize.log
    : > "$out"
    for m in qforge-demo-11m-f16 stories260K; do
        for s in "Hello world" " Hello world" "The quick brown fox jumps over the lazy dog." \
                 "int main(void) { return 0; }" "Once upon a time" "<|endoftext|>Hi"; do
            for flags in "" "--no-bos" "--no-parse-special"; do
                printf '%s | %q | %s | ' "$m" "$s" "${flags:-default}" >> "$out"
                # shellcheck disable=SC2086
                "$BIN/llama-tokenize" -m "$M/$m.gguf" -p "$s" --ids --log-disable $flags 2>/dev/null | tail -n 1 >> "$out"
            done
        done
    done
    # Token count of each corpus exactly as llama-perplexity sees it: -f drops ONE trailing
    # '\n', no escape processing, special tokens NOT parsed, BOS added (add_bos_token).
    for f in kerneldoc-demo/docs.txt wikitext-2-raw-test.txt tinystories-valid-head.txt \
             tinyshakespeare.txt tinystories-sample-cs336.txt wikitext-2-valid.tokens.txt; do
        for m in qforge-demo-11m-f16 stories260K; do
            n=$(python3 -c 'import sys;d=open(sys.argv[1],"rb").read();sys.stdout.buffer.write(d[:-1] if d.endswith(b"\n") else d)' "$C/$f" |
                "$BIN/llama-tokenize" -m "$M/$m.gguf" --stdin --no-escape --no-parse-special --show-count --ids --log-disable 2>/dev/null |
                grep -o 'Total number of tokens: [0-9]*' | grep -o '[0-9]*$')
            echo "tokens $f $m $n" >> "$out"
        done
    done
    cat "$out"
}

sec_summary() {
    printf 'log\ttokens\tchunks\tppl\terr\twall_s\n'
    for f in "$REF_OUT"/ppl-*.log "$REF_OUT"/kvq-*.log "$REF_OUT"/speed-*.log; do
        [ -f "$f" ] || continue
        tok=$(grep -o 'have [0-9]* tokens\|tokenizes to only [0-9]* tokens' "$f" | grep -o '[0-9]*' | head -1)
        ch=$(grep -o 'calculating perplexity over [0-9]* chunks' "$f" | grep -o '[0-9]*' | head -1)
        [ -n "$tok" ] || tok=$(grep -o 'tokenizes to only [0-9]*' "$f" | grep -o '[0-9]*$')
        fin=$(grep -o 'PPL = [0-9.]* +/- [0-9.]*' "$f" | awk '{print $3"\t"$5}')
        w=$(awk '/wall_seconds/{print $2}' "$f")
        printf '%s\t%s\t%s\t%s\t%s\n' "$(basename "$f" .log)" "${tok:-?}" "${ch:-?}" "${fin:-?	?}" "${w:-?}"
    done
}

secs=("$@")
[ ${#secs[@]} -gt 0 ] || secs=(ppl quant kvq kld speed tok summary)
for s in "${secs[@]}"; do
    echo "== $s"
    "sec_$s"
done
