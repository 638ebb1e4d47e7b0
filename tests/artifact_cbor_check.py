#!/usr/bin/env python3
# artifact_cbor_check.py: an independent reader for .qfa files (python3-cbor2, hashlib; no
# qforge code), run by tests/test_artifact.c. It checks the byte layout, the checksum, the key
# order of every map, the payload hash over the payload's own bytes, and that each provenance,
# metric and gate field equals the expected value.
#   usage: artifact_cbor_check.py FILE.qfa EXPECTED.json    (exit 0 = all checks passed)
import hashlib
import io
import json
import struct
import sys

import cbor2

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def main():
    data = open(sys.argv[1], "rb").read()
    want = json.load(open(sys.argv[2]))

    check(data[:8] == b"QFORGEA\0", "magic")
    version, body_len = struct.unpack_from("<IQ", data, 8)
    check(version == 1, "version %d" % version)
    body = data[20:20 + body_len]
    signed_end = 20 + body_len
    check(hashlib.sha256(data[:signed_end]).digest() == data[signed_end:signed_end + 32], "checksum")
    (sig_len,) = struct.unpack_from("<I", data, signed_end + 32)
    check(sig_len in (0, 96) and len(data) == signed_end + 36 + sig_len, "signature block")

    # Walk the top-level map by hand to learn each value's byte range (payload_sha256 covers
    # the payload value's own bytes).
    fp = io.BytesIO(body)
    dec = cbor2.CBORDecoder(fp)
    check(fp.read(1) == b"\xa7", "body is a map of 7")
    top, ranges = {}, {}
    for _ in range(7):
        key = dec.decode()
        start = fp.tell()
        top[key] = dec.decode()
        ranges[key] = (start, fp.tell())
    check(fp.tell() == len(body), "body has trailing bytes")
    check(list(top) == ["kind", "provenance", "metrics", "gate", "created_utc", "payload_sha256",
                        "payload"], "top-level keys/order %s" % list(top))

    prov, met, gate = top["provenance"], top["metrics"], top["gate"]
    check(list(prov) == ["model_sha256", "model_name", "model_arch", "corpus_sha256", "corpus_docs",
                         "calib_docs", "eval_docs", "split", "calib_tokens", "eval_tokens",
                         "engine_version", "engine_commit", "config"], "provenance keys/order")
    check(list(met) == ["ref_ppl", "cand_ppl", "delta_ppl", "kld_mean", "kld_p99",
                        "top1_agreement"], "metrics keys/order")
    check(list(gate) == ["max_delta_ppl", "max_kld", "min_top1", "passed"], "gate keys/order")

    check(top["kind"] == want["kind"], "kind")
    for k in ("model_sha256", "corpus_sha256"):
        check(isinstance(prov[k], bytes) and len(prov[k]) == 32 and prov[k].hex() == want[k], k)
    for k in ("model_name", "model_arch", "split", "engine_version", "engine_commit"):
        check(prov[k] == want[k], "%s: %r vs %r" % (k, prov[k], want[k]))
    for k in ("corpus_docs", "calib_docs", "eval_docs", "calib_tokens", "eval_tokens"):
        check(type(prov[k]) is int and prov[k] == want[k], k)
    check(prov["config"] == want["config"] and list(prov["config"]) == list(want["config"]),
          "config %r" % prov["config"])
    for k in met:
        check(type(met[k]) is float and met[k] == want[k], "%s: %r vs %r" % (k, met[k], want[k]))
    for k in ("max_delta_ppl", "max_kld", "min_top1"):
        check(gate[k] == want[k], "gate %s" % k)
    check(gate["passed"] is want["passed"], "passed")
    check(top["created_utc"] == want["created_utc"], "created_utc")

    a, b = ranges["payload"]
    payload_hash = hashlib.sha256(body[a:b]).hexdigest()
    check(top["payload_sha256"].hex() == payload_hash == want["payload_sha256"], "payload_sha256")

    # The payload entries: name/type first, arrays as little-endian bstr matching the shape.
    sizes = {"f32": 4, "u8": 1, "i8": 1}
    for e in top["payload"]:
        keys = list(e)
        if e["type"] in sizes:
            check(keys == ["name", "type", "shape", "data"], "entry keys %s" % keys)
            n = 1
            for d in e["shape"]:
                n *= d
            check(len(e["data"]) == n * sizes[e["type"]], "entry %s size" % e["name"])
        else:
            check(keys == ["name", "type", "value"], "entry keys %s" % keys)
    named = {e["name"]: e for e in top["payload"]}
    if "k_scale" in named:
        ks = struct.unpack("<6f", named["k_scale"]["data"])
        check(ks[:3] == (0.5, 1.25, -3.0) and named["k_scale"]["shape"] == [2, 3], "k_scale values")

    for f in failures:
        print("artifact_cbor_check: FAIL:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
