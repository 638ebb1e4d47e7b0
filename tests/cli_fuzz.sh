#!/usr/bin/env bash
# cli_fuzz.sh: build every fuzz/fuzz_*.c harness (make fuzz, clang + libFuzzer) and run each for
# a bounded time over a temporary seed corpus made from the real test data: the vocab GGUFs and
# stories260K cut to small prefixes, a small valid GGUF with tensors and nested arrays, and (for
# the tokenizer harness) the vocab .inp texts. Nothing is written into the repository except
# build-fuzz/. A crash, leak or timeout is a failure; no clang/libFuzzer is a skip.
# QF_FUZZ_SECONDS sets the time per harness (default 20).
set -u
cd "$(dirname "$0")/.."
data=${QF_DATA_DIR:-../shared/data}
secs=${QF_FUZZ_SECONDS:-20}
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

# Seeds shared by every harness: prefixes of real GGUFs (the reader's header/KV/tensor-info
# region, where the parsing happens) and one small complete file.
seeds=$tmp/seeds
mkdir -p "$seeds"
n_seed=0
for f in "$data"/vocab/*.gguf "$data"/models/stories260K.gguf; do
    [ -f "$f" ] || continue
    b=$(basename "$f" .gguf)
    for n in 256 4096 32768; do head -c "$n" "$f" >"$seeds/$b-$n"; n_seed=$((n_seed + 1)); done
done
python3 - "$seeds/small-valid.gguf" <<'EOF' && n_seed=$((n_seed + 1))
import struct, sys
def s(x): b = x.encode(); return struct.pack('<Q', len(b)) + b
kv = [
    (s('general.architecture'), 8, s('llama')),
    (s('general.alignment'), 4, struct.pack('<I', 32)),
    (s('tokenizer.ggml.tokens'), 9, struct.pack('<IQ', 8, 3) + s('<unk>') + s('a') + s('bc')),
    (s('test.nested'), 9, struct.pack('<IQ', 9, 2) + struct.pack('<IQ', 6, 2) + struct.pack('<ff', 1.5, -2)
        + struct.pack('<IQ', 8, 1) + s('x')),
    (s('test.flag'), 7, b'\x01'),
    (s('test.i64'), 11, struct.pack('<q', -5)),
]
tensors = [('a', [32, 2], 0, 0), ('b', [32], 8, 256)]  # f32 64 elems, q8_0 32 elems
out = b'GGUF' + struct.pack('<IQQ', 3, len(tensors), len(kv))
for k, t, v in kv: out += k + struct.pack('<I', t) + v
for name, ne, ty, off in tensors:
    out += s(name) + struct.pack('<I', len(ne)) + b''.join(struct.pack('<q', d) for d in ne)
    out += struct.pack('<IQ', ty, off)
out += b'\0' * (-len(out) % 32)
out += b'\x11' * 256 + b'\x22' * 34 + b'\0' * (-34 % 32)
open(sys.argv[1], 'wb').write(out)
EOF
if [ "$n_seed" -eq 0 ]; then echo "note: no seed files found under $data (running from an empty corpus)"; fi

for src in fuzz/fuzz_*.c; do
    [ -e "$src" ] || continue
    name=$(basename "$src" .c)
    bin=build-fuzz/$name
    corpus=$tmp/corpus-$name
    mkdir -p "$corpus"
    extra=()
    if [ "$name" = fuzz_tokenizer ]; then
        # Text is what it tokenizes: the .inp test strings, plus only the small binary
        # prefixes (32 KiB of binary makes each run slow and teaches the fuzzer nothing).
        cp "$seeds"/*-256 "$corpus"/ 2>/dev/null
        for f in "$data"/vocab/*.inp; do [ -f "$f" ] && cp "$f" "$corpus/"; done
        extra=(-max_len=4096)
        if [ -z "${QF_FUZZ_VOCAB:-}" ] && [ -f "$data/vocab/ggml-vocab-gpt-2.gguf" ]; then
            export QF_FUZZ_VOCAB="$data/vocab/ggml-vocab-gpt-2.gguf"
        fi
    else
        cp "$seeds"/* "$corpus"/ 2>/dev/null
    fi
    log=$tmp/$name.log
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        "${extra[@]}" -artifact_prefix="$tmp/$name-" "$corpus" >"$log" 2>&1
    rc=$?
    runs=$(grep -oE 'Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' | tail -n 1)
    if [ "$rc" -eq 0 ]; then
        echo "PASS $name: ${runs:-?} runs in ${secs}s, no crash"
        pass=$((pass + 1))
    else
        echo "FAIL $name: libFuzzer exit $rc"
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
