#!/usr/bin/env python3
"""families_gguf.py: write the tiny random-weight family models (tools/hf_families.py) to GGUF.

Pure Python (no numpy, no torch), so it runs on the device next to transformers and on a
machine without either: it reads the raw parameter dump `<fam>.params` and the description
`<fam>.json` that hf_families.py writes, and writes `<fam>.gguf` with llama.cpp's key and
tensor names for that architecture (f32 tensors, a small SentencePiece-style byte vocabulary).

    python3 tools/families_gguf.py DIR [FAMILY ...]     # every *.json in DIR by default

Conventions it applies (the same as llama.cpp's convert_hf_to_gguf.py; no code copied):
  - a torch weight [out, in] is stored as GGUF ne = [in, out] (same bytes);
  - Gemma RMSNorm weights are stored as 1 + w (Gemma's norm multiplies by 1 + w);
  - the llama architecture (mixtral-style MoE) stores Q and K rows permuted from the
    rotate-half (NEOX) order to llama.cpp's adjacent-pair (NORM) RoPE order;
  - MoE experts are 3-D tensors ffn_{gate,up}_exps [n_embd, n_ff, n_expert] and
    ffn_down_exps [n_ff, n_embd, n_expert]; the router is ffn_gate_inp [n_embd, n_expert].
"""
import json
import os
import struct
import sys
from array import array

GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STR, GGUF_ARR = 4, 5, 6, 7, 8, 9
ALIGN = 32


class Tensor:
    """A row-major f32 tensor: shape is torch order (outermost first)."""

    def __init__(self, shape, data):
        self.shape = list(shape)
        self.data = data  # array('f')
        n = 1
        for s in self.shape:
            n *= s
        assert len(data) == n, (shape, len(data))

    def rows(self, r0, r1):
        """rows [r0, r1) of the outermost dimension as a new tensor"""
        inner = len(self.data) // self.shape[0]
        return Tensor([r1 - r0] + self.shape[1:], self.data[r0 * inner:r1 * inner])


def load_params(path):
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen).decode())
        blob = f.read()
    out = {}
    for name, (off, shape) in header.items():
        n = 1
        for s in shape:
            n *= s
        a = array("f")
        a.frombytes(blob[off:off + 4 * n])
        if sys.byteorder != "little":
            a.byteswap()
        out[name] = Tensor(shape, a)
    return out


def plus_one(t):
    return Tensor(t.shape, array("f", [v + 1.0 for v in t.data]))


def permute_rope(t, n_head):
    """[n_head * hd, in] rotate-half row order -> adjacent-pair order (per head: rows
    (i, i + hd/2) become (2i, 2i + 1))."""
    out_rows, inner = t.shape[0], len(t.data) // t.shape[0]
    hd = out_rows // n_head
    res = array("f", bytes(4 * len(t.data)))
    for h in range(n_head):
        for i in range(hd // 2):
            for j, src in ((2 * i, i), (2 * i + 1, i + hd // 2)):
                s = (h * hd + src) * inner
                d = (h * hd + j) * inner
                res[d:d + inner] = t.data[s:s + inner]
    return Tensor(t.shape, res)


def stack(ts):
    a = array("f")
    for t in ts:
        a.extend(t.data)
    return Tensor([len(ts)] + ts[0].shape, a)


class Writer:
    def __init__(self):
        self.kv = []
        self.tensors = []

    def add(self, key, typ, val):
        self.kv.append((key, typ, val))

    def u32(self, key, v):
        self.add(key, GGUF_U32, int(v))

    def f32(self, key, v):
        self.add(key, GGUF_F32, float(v))

    def str(self, key, v):
        self.add(key, GGUF_STR, v)

    def boolean(self, key, v):
        self.add(key, GGUF_BOOL, bool(v))

    def arr(self, key, etyp, vals):
        self.add(key, GGUF_ARR, (etyp, vals))

    def tensor(self, name, t):
        self.tensors.append((name, t))

    @staticmethod
    def _s(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    def _val(self, typ, v):
        if typ == GGUF_U32:
            return struct.pack("<I", v)
        if typ == GGUF_I32:
            return struct.pack("<i", v)
        if typ == GGUF_F32:
            return struct.pack("<f", v)
        if typ == GGUF_BOOL:
            return struct.pack("<B", 1 if v else 0)
        if typ == GGUF_STR:
            return self._s(v)
        etyp, vals = v
        return struct.pack("<IQ", etyp, len(vals)) + b"".join(self._val(etyp, x) for x in vals)

    def write(self, path):
        out = bytearray(b"GGUF")
        out += struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for key, typ, v in self.kv:
            out += self._s(key) + struct.pack("<I", typ) + self._val(typ, v)
        off = 0
        blobs = []
        for name, t in self.tensors:
            ne = list(reversed(t.shape))
            out += self._s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne)
            out += struct.pack("<IQ", 0, off)  # type F32
            b = t.data.tobytes() if sys.byteorder == "little" else None
            pad = (-len(b)) % ALIGN
            blobs.append(b + b"\0" * pad)
            off += len(b) + pad
        out += b"\0" * ((-len(out)) % ALIGN)
        for b in blobs:
            out += b
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(out)
        os.replace(tmp, path)


def vocab(n_vocab, arch=""):
    """<unk> <s> </s>, the 256 byte tokens, then NORMAL pieces: llama-style SentencePiece.
    phi3 ends with a CONTROL <|endoftext|>: llama.cpp looks that token up by text for any model
    named phi3 (its per-model token attributes) and fails to load a vocabulary without it."""
    toks, types, scores = ["<unk>", "<s>", "</s>"], [2, 3, 3], [0.0, 0.0, 0.0]
    for b in range(256):
        toks.append("<0x%02X>" % b)
        types.append(6)
        scores.append(0.0)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    pieces = ["\u2581" + c for c in letters] + list(letters)
    pieces += ["\u2581" + a + b for a in letters for b in letters]
    pieces += [a + b for a in letters for b in letters]
    i = 0
    while len(toks) < n_vocab:
        toks.append(pieces[i])
        types.append(1)
        scores.append(-float(i))
        i += 1
    if arch == "phi3":
        toks[-1], types[-1], scores[-1] = "<|endoftext|>", 3, 0.0
    return toks, types, scores


def export(desc, P, path):
    fam = desc["family"]
    arch = desc["arch"]
    hp = desc["hparams"]
    w = Writer()
    w.str("general.architecture", arch)
    w.str("general.name", "qforge-tiny-" + fam)
    w.u32("general.alignment", ALIGN)
    a = arch + "."
    w.u32(a + "context_length", hp["n_ctx"])
    w.u32(a + "embedding_length", hp["hidden"])
    w.u32(a + "block_count", hp["n_layer"])
    w.u32(a + "feed_forward_length", hp["ff"])
    w.u32(a + "attention.head_count", hp["n_head"])
    w.u32(a + "attention.head_count_kv", hp["n_head_kv"])
    w.u32(a + "attention.key_length", hp["head_dim"])
    w.u32(a + "attention.value_length", hp["head_dim"])
    w.f32(a + "attention.layer_norm_rms_epsilon", hp["eps"])
    w.f32(a + "rope.freq_base", hp["rope_base"])
    w.u32(a + "rope.dimension_count", hp["head_dim"])
    if "sliding_window" in hp:
        w.u32(a + "attention.sliding_window", hp["sliding_window"])
    if hp.get("attn_softcap"):
        w.f32(a + "attn_logit_softcapping", hp["attn_softcap"])
    if hp.get("final_softcap"):
        w.f32(a + "final_logit_softcapping", hp["final_softcap"])
    if "rope_base_swa" in hp:
        w.f32(a + "rope.freq_base_swa", hp["rope_base_swa"])
    if "swa_pattern" in hp:
        w.u32(a + "attention.sliding_window_pattern", hp["swa_pattern"])
    if "n_expert" in hp:
        w.u32(a + "expert_count", hp["n_expert"])
        w.u32(a + "expert_used_count", hp["n_expert_used"])
        if arch in ("qwen3moe", "qwen2moe"):
            w.u32(a + "expert_feed_forward_length", hp["ff_exp"])
        if "ff_shexp" in hp:
            w.u32(a + "expert_shared_feed_forward_length", hp["ff_shexp"])
    toks, types, scores = vocab(hp["vocab"], arch)
    w.str("tokenizer.ggml.model", "llama")
    w.arr("tokenizer.ggml.tokens", GGUF_STR, toks)
    w.arr("tokenizer.ggml.scores", GGUF_F32, scores)
    w.arr("tokenizer.ggml.token_type", GGUF_I32, types)
    w.u32("tokenizer.ggml.unknown_token_id", 0)
    w.u32("tokenizer.ggml.bos_token_id", 1)
    w.u32("tokenizer.ggml.eos_token_id", 2)
    w.boolean("tokenizer.ggml.add_bos_token", False)

    gemma = arch in ("gemma2", "gemma3")
    norm = plus_one if gemma else (lambda t: t)
    used = set()

    def get(name):
        used.add(name)
        return P[name]

    def find(*names):
        for n in names:
            if n in P:
                return n
        return None

    w.tensor("token_embd.weight", get("model.embed_tokens.weight"))
    w.tensor("output_norm.weight", norm(get("model.norm.weight")))
    if "lm_head.weight" in P and not desc.get("tied", False):
        w.tensor("output.weight", get("lm_head.weight"))
    elif "lm_head.weight" in P:
        used.add("lm_head.weight")
    H, F = hp["hidden"], hp["ff"]
    for il in range(hp["n_layer"]):
        p = "model.layers.%d." % il
        b = "blk.%d." % il
        w.tensor(b + "attn_norm.weight", norm(get(p + "input_layernorm.weight")))
        if arch == "phi3":
            w.tensor(b + "attn_qkv.weight", get(p + "self_attn.qkv_proj.weight"))
        else:
            q, k = get(p + "self_attn.q_proj.weight"), get(p + "self_attn.k_proj.weight")
            if arch == "llama":
                q, k = permute_rope(q, hp["n_head"]), permute_rope(k, hp["n_head_kv"])
            w.tensor(b + "attn_q.weight", q)
            w.tensor(b + "attn_k.weight", k)
            w.tensor(b + "attn_v.weight", get(p + "self_attn.v_proj.weight"))
            for hn, gn in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
                if p + "self_attn.%s.bias" % hn in P:  # qwen2, qwen2moe
                    w.tensor(b + gn + ".bias", get(p + "self_attn.%s.bias" % hn))
        w.tensor(b + "attn_output.weight", get(p + "self_attn.o_proj.weight"))
        if p + "self_attn.q_norm.weight" in P:
            w.tensor(b + "attn_q_norm.weight", norm(get(p + "self_attn.q_norm.weight")))
            w.tensor(b + "attn_k_norm.weight", norm(get(p + "self_attn.k_norm.weight")))
        if gemma:
            w.tensor(b + "post_attention_norm.weight", norm(get(p + "post_attention_layernorm.weight")))
            w.tensor(b + "ffn_norm.weight", norm(get(p + "pre_feedforward_layernorm.weight")))
            w.tensor(b + "post_ffw_norm.weight", norm(get(p + "post_feedforward_layernorm.weight")))
        else:
            w.tensor(b + "ffn_norm.weight", get(p + "post_attention_layernorm.weight"))
        if "n_expert" in hp:
            E, Fe = hp["n_expert"], hp["ff_exp"]
            moe = p + ("block_sparse_moe." if find(p + "block_sparse_moe.gate.weight") else "mlp.")
            w.tensor(b + "ffn_gate_inp.weight", get(find(moe + "gate.weight", moe + "router.weight")))
            if moe + "experts.0.gate_proj.weight" in P or moe + "experts.0.w1.weight" in P:
                g_n, u_n, d_n = (("gate_proj", "up_proj", "down_proj") if moe + "experts.0.gate_proj.weight" in P
                                 else ("w1", "w3", "w2"))
                gate = stack([get(moe + "experts.%d.%s.weight" % (e, g_n)) for e in range(E)])
                up = stack([get(moe + "experts.%d.%s.weight" % (e, u_n)) for e in range(E)])
                down = stack([get(moe + "experts.%d.%s.weight" % (e, d_n)) for e in range(E)])
            else:  # transformers v5 fused experts: gate_up_proj [E, 2F, H], down_proj [E, H, F]
                gu = get(find(moe + "experts.gate_up_proj", moe + "experts.gate_up_proj.weight"))
                dn = get(find(moe + "experts.down_proj", moe + "experts.down_proj.weight"))
                if gu.shape != [E, 2 * Fe, H] or dn.shape != [E, H, Fe]:
                    raise SystemExit("%s: unexpected fused expert shapes %s %s" % (fam, gu.shape, dn.shape))
                gs, us = [], []
                for e in range(E):
                    ge = gu.rows(e, e + 1)
                    ge = Tensor(ge.shape[1:], ge.data)
                    gs.append(ge.rows(0, Fe))
                    us.append(ge.rows(Fe, 2 * Fe))
                gate, up = stack(gs), stack(us)
                down = dn
            w.tensor(b + "ffn_gate_exps.weight", gate)
            w.tensor(b + "ffn_up_exps.weight", up)
            w.tensor(b + "ffn_down_exps.weight", down)
            if moe + "shared_expert.gate_proj.weight" in P:  # qwen2moe: sigmoid-gated shared expert
                sg = get(moe + "shared_expert_gate.weight")  # [1, H] -> GGUF [H], as llama.cpp
                w.tensor(b + "ffn_gate_inp_shexp.weight", Tensor([H], sg.data))
                w.tensor(b + "ffn_gate_shexp.weight", get(moe + "shared_expert.gate_proj.weight"))
                w.tensor(b + "ffn_up_shexp.weight", get(moe + "shared_expert.up_proj.weight"))
                w.tensor(b + "ffn_down_shexp.weight", get(moe + "shared_expert.down_proj.weight"))
        elif arch == "phi3":
            w.tensor(b + "ffn_up.weight", get(p + "mlp.gate_up_proj.weight"))
            w.tensor(b + "ffn_down.weight", get(p + "mlp.down_proj.weight"))
        else:
            w.tensor(b + "ffn_gate.weight", get(p + "mlp.gate_proj.weight"))
            w.tensor(b + "ffn_up.weight", get(p + "mlp.up_proj.weight"))
            w.tensor(b + "ffn_down.weight", get(p + "mlp.down_proj.weight"))
    left = sorted(set(P) - used)
    if left:
        raise SystemExit("%s: parameters not exported: %s" % (fam, left))
    w.write(path)
    return os.path.getsize(path)


def main():
    d = sys.argv[1]
    fams = sys.argv[2:] or sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json"))
    for fam in fams:
        with open(os.path.join(d, fam + ".json")) as f:
            desc = json.load(f)
        P = load_params(os.path.join(d, fam + ".params"))
        n = export(desc, P, os.path.join(d, fam + ".gguf"))
        print("%s: %s.gguf %d bytes" % (fam, fam, n))


if __name__ == "__main__":
    main()
