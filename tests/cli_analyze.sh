#!/usr/bin/env bash
# cli_analyze.sh: `qforge analyze` end to end on the demo model (small settings so it is quick):
# JSON rows per layer and stream with relative errors in [0, 1], the SVG, and bad flags.
set -u
Q=${QF_BUILD:-build}/qforge
D=${QF_DATA_DIR:-../shared/data}
pass=0 fail=0 skip=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
ko() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d)
model=assets/models/qforge-demo-11m-f16.gguf
if "$Q" analyze -m "$model" --max-tok 1024 --max-per-layer 512 --atoms 32 --sparsity 2 --iters 3 --rd 16x2,32x4 \
      --layer-stride 3 -t 2 --json --svg "$tmp/rd.svg" > "$tmp/a.json" 2> "$tmp/err"; then
    if python3 - "$tmp/a.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["layers"]
assert len(rows) == 4, len(rows)                 # layers 0 and 3, K and V
for r in rows:
    for k in ("int8_rel_mse", "dict_rel_mse", "uniform_matched_rel_mse", "best_baseline_rel_mse"):
        assert 0.0 <= r[k] <= 1.0, (k, r[k])
    assert r["stream"] in ("K", "V") and r["n_vectors"] > 0
assert j["cross_check_max_rel_diff"] < 1e-4
assert any(c["method"] == "hadamard" for c in j["rate_distortion"])
PY
    then ok analyze_json_rows; else ko analyze_json_rows; fi
    grep -q "<svg" "$tmp/rd.svg" && grep -q "polyline" "$tmp/rd.svg" && ok analyze_svg || ko analyze_svg
else
    cat "$tmp/err"; ko analyze_runs; ko analyze_svg
fi
"$Q" analyze -m "$model" --atoms 0 > /dev/null 2>&1; [ $? -eq 1 ] && ok bad_flag_is_usage_error || ko bad_flag_is_usage_error
"$Q" analyze -m /nonexistent.gguf --max-tok 64 > /dev/null 2> "$tmp/e"; rc=$?
[ $rc -ne 0 ] && grep -q nonexistent "$tmp/e" && ok missing_model_named || ko missing_model_named
"$Q" analyze -m "$model" --corpus "$tmp/empty_dir_does_not_exist" > /dev/null 2> "$tmp/e"; [ $? -ne 0 ] && ok missing_corpus || ko missing_corpus
mkdir -p "$tmp/empty" && : > "$tmp/empty/a.txt"
"$Q" analyze -m "$model" --corpus "$tmp/empty" > /dev/null 2> "$tmp/e"; grep -q CorpusEmpty "$tmp/e" && ok empty_corpus || ko empty_corpus
rm -rf "$tmp"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
