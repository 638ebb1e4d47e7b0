#!/usr/bin/env python3
"""hf_families.py: the transformers oracle for the model families qforge runs (issue 11).

For each family it builds the Hugging Face transformers model from a SMALL config with random
weights (no download; torch.manual_seed; float32), runs a fixed token sequence through it and
writes into --out:
    <fam>.json    what was built (hyper-parameters as GGUF will carry them, transformers' view)
    <fam>.params  every parameter, raw f32 (8-byte header length, JSON header, data)
    <fam>.logits  reference logits: "QFLG", u32 version 1, u32 n_tok, u32 n_vocab,
                  i32 tokens[n_tok], f32 logits[n_tok][n_vocab] (little-endian)
    <fam>.gguf    written by tools/families_gguf.py (pure Python, re-runnable without torch)
Needs torch and transformers (the device machine); a family that fails is reported and the
others still run. Usage: python3 hf_families.py --out DIR [family ...]
"""
import argparse
import inspect
import json
import math
import os
import struct
import sys
import traceback

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import families_gguf  # noqa: E402

N_TOK = 128
VOCAB = 512

# name -> (transformers config class, model class, GGUF arch, hyper-parameters)
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "qwen3",
              dict(hidden=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=32, ff=128, eps=1e-6,
                   rope_base=1000000.0, tied=False)),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen3moe",
                 dict(hidden=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=16, ff=96, ff_exp=48,
                      n_expert=8, n_expert_used=2, eps=1e-6, rope_base=1000000.0, tied=True)),
    # qwen1.5/qwen2 MoE: q/k/v biases, top-k not renormalized, a sigmoid-gated shared expert
    "qwen2moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "qwen2moe",
                 dict(hidden=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=16, ff=96, ff_exp=32, ff_shexp=64,
                      n_expert=8, n_expert_used=2, eps=1e-6, rope_base=1000000.0, tied=False)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "llama",
                dict(hidden=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=16, ff=96, ff_exp=96,
                     n_expert=4, n_expert_used=2, eps=1e-5, rope_base=1000000.0, tied=False)),
    # 26 layers: llama.cpp (b4748) picks gemma2's attention scale from the layer count
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "gemma2",
               dict(hidden=32, n_layer=26, n_head=2, n_head_kv=1, head_dim=16, ff=64, eps=1e-6,
                    rope_base=10000.0, sliding_window=32, attn_softcap=2.5, final_softcap=3.0,
                    tied=True)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", "gemma3",
               dict(hidden=64, n_layer=6, n_head=4, n_head_kv=2, head_dim=32, ff=128, eps=1e-6,
                    rope_base=1000000.0, rope_base_swa=10000.0, sliding_window=24, swa_pattern=6,
                    tied=True)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "phi3",
             dict(hidden=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=16, ff=128, eps=1e-5,
                  rope_base=10000.0, sliding_window=4096, tied=False)),
}


def layer_types(fam, hp):
    n = hp["n_layer"]
    if fam == "gemma2":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if fam == "gemma3":
        return ["sliding_attention" if (i + 1) % hp["swa_pattern"] else "full_attention" for i in range(n)]
    return ["full_attention"] * n


def make_config(fam, cls, hp):
    sig = inspect.signature(cls.__init__).parameters
    kw = dict(vocab_size=VOCAB, hidden_size=hp["hidden"], intermediate_size=hp["ff"],
              num_hidden_layers=hp["n_layer"], num_attention_heads=hp["n_head"],
              num_key_value_heads=hp["n_head_kv"], max_position_embeddings=2048,
              rms_norm_eps=hp["eps"], tie_word_embeddings=hp["tied"], attention_dropout=0.0)
    if "head_dim" in sig:
        kw["head_dim"] = hp["head_dim"]
    if fam in ("gemma2", "gemma3"):
        kw.update(query_pre_attn_scalar=hp["head_dim"], hidden_activation="gelu_pytorch_tanh",
                  sliding_window=hp["sliding_window"], attn_logit_softcapping=hp.get("attn_softcap"),
                  final_logit_softcapping=hp.get("final_softcap"))
    if fam == "phi3":
        kw.update(sliding_window=hp["sliding_window"], resid_pdrop=0.0, embd_pdrop=0.0,
                  original_max_position_embeddings=2048, pad_token_id=0)
    if fam == "qwen3moe":
        kw.update(moe_intermediate_size=hp["ff_exp"], num_experts=hp["n_expert"],
                  num_experts_per_tok=hp["n_expert_used"], norm_topk_prob=True, decoder_sparse_step=1,
                  mlp_only_layers=[], router_aux_loss_coef=0.0, output_router_logits=False)
    if fam == "qwen2moe":
        kw.update(moe_intermediate_size=hp["ff_exp"], shared_expert_intermediate_size=hp["ff_shexp"],
                  num_experts=hp["n_expert"], num_experts_per_tok=hp["n_expert_used"], norm_topk_prob=False,
                  decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.0, output_router_logits=False,
                  use_sliding_window=False, qkv_bias=True)
    if fam == "mixtral":
        kw.update(num_local_experts=hp["n_expert"], num_experts_per_tok=hp["n_expert_used"],
                  router_jitter_noise=0.0, sliding_window=None, output_router_logits=False)
    if "layer_types" in sig:
        kw["layer_types"] = layer_types(fam, hp)
    if fam == "gemma3":
        if "rope_parameters" in sig:
            kw["rope_parameters"] = {
                "full_attention": {"rope_type": "default", "rope_theta": hp["rope_base"]},
                "sliding_attention": {"rope_type": "default", "rope_theta": hp["rope_base_swa"]}}
        else:
            kw.update(rope_theta=hp["rope_base"], rope_local_base_freq=hp["rope_base_swa"],
                      sliding_window_pattern=hp["swa_pattern"])
    elif "rope_parameters" in sig:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": hp["rope_base"]}
    else:
        kw["rope_theta"] = hp["rope_base"]
    # keep only what this transformers version takes (print the rest)
    dropped = [k for k in kw if k not in sig and not any(p.kind == p.VAR_KEYWORD for p in sig.values())]
    if dropped:
        print("  %s: config takes no %s" % (cls.__name__, dropped))
    cfg = cls(**kw)
    try:
        cfg._attn_implementation = "eager"
    except Exception as e:  # noqa: BLE001
        print("  cannot set eager attention on the config:", e)
    return cfg


def rope_bases(model):
    """every inv_freq buffer -> the base it implies (base = inv_freq[1] ** (-dim / 2))"""
    out = {}
    for name, buf in model.named_buffers():
        if "inv_freq" in name and buf.numel() > 1:
            dim = 2 * buf.numel()
            out[name] = float(buf[1].double() ** (-dim / 2.0))
    return out


def init_weights(model, fam, hp, gen):
    gemma = fam.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma norms multiply by 1 + w
                base = 0.0 if gemma else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif "lm_head" in name:
                p.copy_(2.0 / math.sqrt(p.shape[-1]) * torch.randn(p.shape, generator=gen))
            elif name.endswith("gate.weight") or "router" in name:
                p.copy_(2.0 / math.sqrt(p.shape[-1]) * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                p.copy_(1.0 / math.sqrt(p.shape[-1]) * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def tensor_bytes(t):
    t = t.detach().to("cpu", torch.float32).contiguous()
    try:
        return t.numpy().tobytes()
    except Exception:  # noqa: BLE001 (no numpy)
        return struct.pack("<%df" % t.numel(), *t.flatten().tolist())


def run_family(fam, out):
    cfg_name, model_name, arch, hp = FAMILIES[fam]
    hp = dict(hp, vocab=VOCAB, n_ctx=2048)
    cfg_cls = getattr(transformers, cfg_name)
    model_cls = getattr(transformers, model_name)
    torch.manual_seed(11)
    cfg = make_config(fam, cfg_cls, hp)
    try:
        model = model_cls(cfg)
    except TypeError:
        model = model_cls._from_config(cfg, attn_implementation="eager")
    model = model.to(torch.float32).eval()
    try:
        model.config._attn_implementation = "eager"
    except Exception:  # noqa: BLE001
        pass
    gen = torch.Generator().manual_seed(1100 + sum(map(ord, fam)))
    init_weights(model, fam, hp, gen)
    bases = rope_bases(model)
    print("  config:", {k: getattr(cfg, k, None) for k in (
        "head_dim", "layer_types", "sliding_window", "rope_theta", "rope_parameters",
        "rope_local_base_freq", "query_pre_attn_scalar", "attn_logit_softcapping",
        "final_logit_softcapping", "hidden_activation", "hidden_act", "norm_topk_prob",
        "num_experts", "num_local_experts", "num_experts_per_tok", "tie_word_embeddings",
        "moe_intermediate_size", "shared_expert_intermediate_size", "qkv_bias",
        "_attn_implementation")})
    print("  rope bases from inv_freq:", bases)
    lt = getattr(cfg, "layer_types", None)
    if lt is not None and list(lt) != layer_types(fam, hp):
        print("  WARNING: layer_types differ from the GGUF convention:", lt)
    params = list(model.named_parameters())
    print("  %d parameters, %d values" % (len(params), sum(p.numel() for _, p in params)))
    for n, p in params[:40]:
        print("    %-60s %s" % (n, list(p.shape)))

    gen_tok = torch.Generator().manual_seed(7)
    tokens = torch.randint(3, VOCAB, (N_TOK,), generator=gen_tok)
    with torch.no_grad():
        logits = model(tokens[None]).logits[0].to(torch.float32)
        try:  # the f64 run only measures float32's own error (MoE grouped matmuls refuse f64)
            l64 = model.to(torch.float64)(tokens[None]).logits[0]
        except Exception as e:  # noqa: BLE001
            print("  no f64 run:", str(e).splitlines()[0])
            l64 = logits.double()
        model.to(torch.float32)
    d = (logits.double() - l64)
    nmse = float((d * d).mean() / (l64 * l64).mean())
    print("  logits std %.3f, f32 vs f64 nMSE %.3e, top1 agree %.4f" % (
        float(logits.std()), nmse, float((logits.argmax(-1) == l64.argmax(-1)).double().mean())))

    # raw parameter dump
    header, blobs, off = {}, [], 0
    for n, p in params:
        b = tensor_bytes(p)
        header[n] = [off, list(p.shape)]
        blobs.append(b)
        off += len(b)
    hb = json.dumps(header).encode()
    with open(os.path.join(out, fam + ".params"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for b in blobs:
            f.write(b)
    with open(os.path.join(out, fam + ".logits"), "wb") as f:
        f.write(b"QFLG" + struct.pack("<III", 1, N_TOK, VOCAB))
        f.write(struct.pack("<%di" % N_TOK, *tokens.tolist()))
        f.write(tensor_bytes(logits))
    desc = dict(family=fam, arch=arch, hparams=hp, tied=hp["tied"], tokens=tokens.tolist(),
                transformers=transformers.__version__, torch=torch.__version__,
                hf_config_class=cfg_name, hf_model_class=model_name, rope_bases_hf=bases,
                layer_types=list(lt) if lt is not None else None, f32_vs_f64_nmse=nmse,
                param_names={n: list(p.shape) for n, p in params})
    with open(os.path.join(out, fam + ".json"), "w") as f:
        json.dump(desc, f, indent=1)
    P = families_gguf.load_params(os.path.join(out, fam + ".params"))
    size = families_gguf.export(desc, P, os.path.join(out, fam + ".gguf"))
    print("  wrote %s.gguf (%d bytes)" % (fam, size))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("families", nargs="*")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_grad_enabled(False)
    torch.backends.cuda.matmul.allow_tf32 = False
    print("torch", torch.__version__, "transformers", transformers.__version__)
    ok = []
    for fam in a.families or list(FAMILIES):
        print("== %s" % fam, flush=True)
        try:
            run_family(fam, a.out)
            ok.append(fam)
        except Exception:  # noqa: BLE001 (one failed family must not stop the others)
            traceback.print_exc()
            print("  FAILED: %s" % fam, flush=True)
    print("done:", ok)


if __name__ == "__main__":
    main()
