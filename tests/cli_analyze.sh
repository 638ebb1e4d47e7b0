#!/usr/bin/env bash
# cli_analyze.sh: `qforge analyze` end to end on the demo model (small settings so it is quick):
# every method measured on the held-out split (bits per element, ΔPPL, KLD vs the f32-KV model),
# the JSON `frontier` (method, bits_per_element, delta_ppl, kld_mean), a verdict per method, the
# SVG written atomically, and bad input.
set -u
Q=${QF_BUILD:-build}/qforge
pass=0 fail=0 skip=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
ko() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d)
model=assets/models/qforge-demo-11m-f16.gguf
small=(-c 128 --chunks 2 --max-tok 1024 --max-per-layer 512 --dict 32x2,64x4 --dict-iters 2 -t 2)
if "$Q" analyze -m "$model" "${small[@]}" --json --svg "$tmp/kld.svg" > "$tmp/a.json" 2> "$tmp/err"; then
    if python3 - "$tmp/a.json" <<'PY'
import json, math, sys
j = json.load(open(sys.argv[1]))
pts = j["points"]
by = {(p["method"], p["label"]): p for p in pts}
# every method of the table, measured on the same evaluation tokens
for m in ("f16", "q8_0", "q4_0", "q8_0+hadamard", "q4_0+hadamard", "kv-int8", "kv-dict", "kv-rq"):
    assert any(p["method"] == m for p in pts), m
assert abs(by[("f16", "f16")]["bits_per_element"] - 16) < 1e-9
assert abs(by[("q8_0", "q8_0")]["bits_per_element"] - 8.5) < 1e-9
assert abs(by[("q4_0", "q4_0")]["bits_per_element"] - 4.5) < 1e-9
assert abs(by[("kv-int8", "per-channel")]["bits_per_element"] - 8) < 1e-9
assert by[("kv-int8", "per-channel")]["bits_per_element_with_tables"] > 8
assert abs(by[("kv-int8", "token-rot")]["bits_per_element"] - 8) < 1e-9  # every layout calibrate tries
assert abs(by[("kv-dict", "32x2-f16")]["bits_per_element"] - (2 * 1 + 2 * 2) * 8 / 64) < 1e-9  # stored: u8 indices, f16 coefficients
for p in pts:
    assert p["kld_mean"] > -1e-5 and 0 <= p["top1"] <= 1, p  # KLD against 16-bit quantized base log-probs: noise can dip below 0
    assert math.isfinite(p["delta_ppl"]), p
# the end metric orders what relative MSE did not: q8_0 beats q4_0 beats a 1-bit dictionary
assert by[("q8_0", "q8_0")]["kld_mean"] < by[("q4_0", "q4_0")]["kld_mean"] < by[("kv-dict", "32x2-f16")]["kld_mean"]
# the rotation is measured for real (--kv-rot hadamard): it beats plain q4_0 at the same rate
assert by[("q4_0+hadamard", "q4_0+hadamard")]["kld_mean"] < by[("q4_0", "q4_0")]["kld_mean"]
# the frontier: the interface names, increasing bits, decreasing KLD, every entry a point
fr = j["frontier"]
assert len(fr) >= 3
for f in fr:
    for k in ("method", "bits_per_element", "delta_ppl", "kld_mean"):
        assert k in f, k
    assert f["on_frontier"] and (f["method"], f["label"]) in by
for a, b in zip(fr, fr[1:]):
    assert a["bits_per_element"] <= b["bits_per_element"] and a["kld_mean"] >= b["kld_mean"], (a, b)
for p in pts:
    if not p["on_frontier"]:
        d = p["dominated_by"]
        q = by[(d["method"], d["label"])]
        assert q["bits_per_element"] <= p["bits_per_element"] and q["kld_mean"] <= p["kld_mean"], (p, q)
v = {x["method"]: x["verdict"] for x in j["verdicts"]}
assert len(v) == 8 and all(s.startswith(("on the frontier", "dominated", "not measured")) for s in v.values()), v
assert j["reference"]["kv"] == "f32" and j["reference"]["ppl"] > 1 and j["chunks"] == 2 and j["n_ctx"] == 128
assert j["cross_check_max_rel_diff"] < 1e-4
PY
    then ok analyze_json_frontier; else ko analyze_json_frontier; fi
    grep -q "<svg" "$tmp/kld.svg" && grep -q "polyline" "$tmp/kld.svg" && grep -q "Pareto frontier" "$tmp/kld.svg" &&
        grep -q ">kv-dict</text>" "$tmp/kld.svg" && ok analyze_svg || ko analyze_svg
else
    cat "$tmp/err"; ko analyze_json_frontier; ko analyze_svg
fi
# text: the table, the frontier and one verdict per method asked for
if "$Q" analyze -m "$model" -c 64 --chunks 2 -t 2 --methods q8_0,q4_0 --no-cross-check > "$tmp/t.out" 2> "$tmp/t.err" &&
    grep -q "^frontier" "$tmp/t.out" && grep -q "^  q4_0 " "$tmp/t.out" && grep -q "^  q8_0 " "$tmp/t.out" &&
    ! grep -q "kv-int8" "$tmp/t.out"; then ok analyze_text_verdicts; else cat "$tmp/t.err"; ko analyze_text_verdicts; fi
# the SVG goes nowhere half-written: a missing directory is an error and leaves nothing
"$Q" analyze -m "$model" -c 64 --chunks 2 -t 2 --methods q8_0 --svg "$tmp/no/such/dir/x.svg" > /dev/null 2> "$tmp/e"
rc=$?; [ $rc -ne 0 ] && [ ! -e "$tmp/no" ] && grep -q "x.svg" "$tmp/e" && ok svg_bad_path || ko svg_bad_path
"$Q" analyze -m "$model" --dict 0x2 > /dev/null 2>&1; [ $? -eq 1 ] && ok bad_dict_is_usage_error || ko bad_dict_is_usage_error
"$Q" analyze -m "$model" --chunks x > /dev/null 2>&1; [ $? -eq 1 ] && ok bad_flag_is_usage_error || ko bad_flag_is_usage_error
"$Q" analyze > /dev/null 2>&1; [ $? -eq 1 ] && ok missing_model_flag || ko missing_model_flag
"$Q" analyze -m "$model" --methods q8_0,bogus > /dev/null 2> "$tmp/e"; rc=$?
[ $rc -eq 1 ] && grep -q "bogus" "$tmp/e" && ok unknown_method_named || ko unknown_method_named  # a usage error: exit 1 (docs)
"$Q" analyze -m /nonexistent.gguf > /dev/null 2> "$tmp/e"; rc=$?
[ $rc -ne 0 ] && grep -q nonexistent "$tmp/e" && ok missing_model_named || ko missing_model_named
"$Q" analyze -m "$model" --corpus "$tmp/empty_dir_does_not_exist" > /dev/null 2> "$tmp/e"; [ $? -ne 0 ] && ok missing_corpus || ko missing_corpus
mkdir -p "$tmp/empty" && : > "$tmp/empty/a.txt"
"$Q" analyze -m "$model" --corpus "$tmp/empty" > /dev/null 2> "$tmp/e"; grep -q CorpusEmpty "$tmp/e" && ok empty_corpus || ko empty_corpus
rm -rf "$tmp"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
