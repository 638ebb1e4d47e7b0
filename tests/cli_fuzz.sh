#!/usr/bin/env bash
# cli_fuzz.sh: build every fuzz/fuzz_*.c harness (make fuzz, clang + libFuzzer) and run each for
# a bounded time (QF_FUZZ_SECONDS each, default 7: six harnesses, about a minute in all with start-up) over a
# temporary seed corpus from tests/helpers/fuzz_seeds.sh (real files where the project has
# them, small valid files it makes itself otherwise; works without ../shared). Nothing is
# written into the repository except build-fuzz/. A crash, leak or timeout is a failure; no
# clang/libFuzzer is a skip. The long runs (>= 1e6 executions each) are in docs/fuzzing.md.
set -u
cd "$(dirname "$0")/.."
data=${QF_DATA_DIR:-../shared/data}
secs=${QF_FUZZ_SECONDS:-7}
pass=0 fail=0 skip=0
finish() {
    echo "$pass passed, $fail failed, $skip skipped"
    [ "$fail" -eq 0 ]
    exit
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The harnesses are built with ASan+UBSan whatever the pass; running them again in the
# sanitizer pass of scripts/test.sh would only repeat the release pass's run.
if [ -n "${QF_ASAN:-}" ]; then
    echo "SKIP fuzz: the harnesses are sanitizer builds already; they ran in the release pass"
    skip=1; finish
fi

if ! command -v clang >/dev/null 2>&1; then
    echo "SKIP fuzz: clang not found (apt-get install clang)"
    skip=1; finish
fi
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' >"$tmp/probe.c"
if ! clang -fsanitize=fuzzer "$tmp/probe.c" -o "$tmp/probe" >/dev/null 2>&1; then
    echo "SKIP fuzz: clang cannot link libFuzzer (-fsanitize=fuzzer)"
    skip=1; finish
fi
if ! make -j2 fuzz >"$tmp/build.log" 2>&1; then
    echo "FAIL fuzz build (make fuzz):"; tail -n 30 "$tmp/build.log"
    fail=1; finish
fi
tests/helpers/fuzz_seeds.sh "$tmp/seeds" "$data"

for src in fuzz/fuzz_*.c; do
    [ -e "$src" ] || continue
    name=$(basename "$src" .c)
    bin=build-fuzz/$name
    corpus=$tmp/seeds/$name
    mkdir -p "$corpus"
    extra=()
    case $name in
    fuzz_tokenizer)
        extra=(-max_len=256)
        if [ -z "${QF_FUZZ_VOCAB:-}" ]; then # BPE, SPM and PCRE2 + many specials; else the demo model's
            v=
            for n in gpt-2 llama-spm deepseek-llm; do
                [ -f "$data/vocab/ggml-vocab-$n.gguf" ] && v=$v${v:+:}$data/vocab/ggml-vocab-$n.gguf
            done
            export QF_FUZZ_VOCAB=${v:-assets/models/qforge-demo-11m-f16.gguf}
        fi ;;
    fuzz_cli) extra=(-max_len=512) ;;
    esac
    log=$tmp/$name.log
    QF_FUZZ_SEED_DIR=$corpus "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        "${extra[@]}" -artifact_prefix="$tmp/$name-" "$corpus" >"$log" 2>&1
    rc=$?
    runs=$(grep -oE 'Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' | tail -n 1)
    if [ "$rc" -eq 0 ] && [ "${runs:-0}" -gt 0 ]; then
        echo "PASS $name: ${runs:-?} runs in ${secs}s, no crash"
        pass=$((pass + 1))
    else
        echo "FAIL $name: libFuzzer exit $rc, ${runs:-0} runs"
        grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$log" | head -n 20
        tail -n 20 "$log"
        for a in "$tmp/$name-"*; do
            [ -f "$a" ] || continue
            keep=/tmp/qforge-$name-crash-$$-$(basename "$a")
            cp "$a" "$keep" && echo "  crashing input saved as $keep (reproduce: $bin $keep)"
        done
        fail=$((fail + 1))
    fi
done
finish
