#!/usr/bin/env bash
# fuzz_seeds.sh OUT_DIR [DATA_DIR]: write a seed corpus for every fuzz/fuzz_*.c harness into
# OUT_DIR/<harness>/ (fuzz_gguf, fuzz_tokenizer, fuzz_artifact, fuzz_corpus, fuzz_klbase,
# fuzz_cli). Real files where the project has them (../shared/data vocab GGUFs and stories260K
# cut to small prefixes, the demo corpus, the vocab .inp texts when present), small valid files
# made here otherwise (a GGUF with tensors and nested arrays, a KL base, argv lines); the
# artifact seeds are written by fuzz_artifact itself (QF_FUZZ_SEED_DIR). Works without
# ../shared: every harness then starts from what the repository can make itself.
set -u
out=$1
data=${2:-${QF_DATA_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/../shared/data}}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"/fuzz_gguf "$out"/fuzz_tokenizer "$out"/fuzz_artifact "$out"/fuzz_corpus "$out"/fuzz_klbase "$out"/fuzz_cli

# GGUF: prefixes of real files (header/KV/tensor-info region) and one small complete file
for f in "$data"/vocab/*.gguf "$data"/models/stories260K.gguf "$root"/assets/models/*.gguf; do
    [ -f "$f" ] || continue
    b=$(basename "$f" .gguf)
    for n in 256 4096; do head -c "$n" "$f" >"$out/fuzz_gguf/$b-$n"; done
done
python3 - "$out/fuzz_gguf/small-valid.gguf" "$out/fuzz_klbase" "$out/fuzz_cli" <<'PY'
import struct, sys, os
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

# KL base (llama-perplexity's _logits_ format): n_ctx 8, n_vocab 16, 2 chunks
n_ctx, n_vocab, n_chunk = 8, 16, 2
n_score = n_ctx - 1 - n_ctx // 2
nv = 2 * ((n_vocab + 1) // 2) + 4
b = b'_logits_' + struct.pack('<iii', n_ctx, n_vocab, n_chunk)
b += b''.join(struct.pack('<i', (i * 7) % n_vocab) for i in range(n_ctx * n_chunk))
for c in range(n_chunk * n_score):
    row = struct.pack('<ff', 16.0 / 65535, -3.5) + b''.join(struct.pack('<H', (i * 4099 + c) % 65536) for i in range(nv - 4))
    b += row
open(os.path.join(sys.argv[2], 'base-8x16x2.kl'), 'wb').write(b)

# argv lines, NUL-separated, as the CLI harness splits them
lines = [
    ['-m', 'm.gguf', '-c', '512', '-t', '4', '-ctk', 'q8_0', '-ctv', 'f16', '--device', 'cpu'],
    ['-m', 'a.gguf', '-m', 'b.gguf', '--artifact', 'x.qfa', '-ctk', 'q4_0'],
    ['--artifact', 'x.qfa', '--trust-key', 'k.pem', '-c', '99999999999'],
    ['--corpus', 'docs', '--builtin', '--gate', '0.05', '--max-kld', '1e-3', '--min-top1', '0.9',
     '--atoms', '256', '--sparsity', '8', '--coef', 'q8', '--seed', '-1', '--eval-frac', '0.2'],
    ['-o', 'out.qfa', '--eval-out', 'out.qfa', '/tmp/../tmp/x', '-', './x'],
    ['-c', '-1', '--ref-kv', 'f32', '--capture', '16', '--max-tok', '0', '--eval-chunks', '0', 'nan', 'inf', '1e309'],
]
for i, l in enumerate(lines):
    open(os.path.join(sys.argv[3], 'argv-%d' % i), 'wb').write(b'\0'.join(x.encode() for x in l))
PY

# tokenizer: text (the vocab test strings when present, the demo corpus), cut to 1 KiB
for f in "$data"/vocab/*.inp; do [ -f "$f" ] && head -c 1024 "$f" >"$out/fuzz_tokenizer/$(basename "$f")"; done
corpus=$root/assets/corpora/kerneldoc-demo/docs.txt
for k in 0 1 2 3; do tail -c +$((k * 50000 + 1)) "$corpus" | head -c 1024 >"$out/fuzz_tokenizer/demo-$k.txt"; done
# corpus text: demo corpus pieces plus hostile normalization cases
for k in 0 1 2 3; do tail -c +$((k * 50000 + 1)) "$corpus" | head -c 4096 >"$out/fuzz_corpus/demo-$k.txt"; done
printf '\xef\xbb\xbfBOM then CRLF\r\nlone CR\rNUL\0here <|endoftext|> next doc\n\n\xc0\xaf overlong \xed\xa0\x80 surrogate \xf4\x90\x80\x80 past U+10FFFF \xe2\x82' >"$out/fuzz_corpus/hostile.txt"
exit 0
