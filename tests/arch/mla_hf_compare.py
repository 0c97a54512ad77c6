#!/usr/bin/env python3
"""The MLA attention block against transformers' DeepseekV3Attention (eager, fp32).

For a few tiny configurations (q_lora_rank none / set, rope_interleave on / off, YaRN with an
attention factor and the softmax mscale, biases), builds DeepseekV3Attention with random weights,
runs it over a few sequences of hidden states with a causal mask, and dumps config, weights
(model.layers.0.self_attn.*) and inputs/outputs into a directory; then runs the gtest
MlaHf.MatchesTransformersDump of test_mla_attention on that directory, which feeds the same
hidden states through make_mla_attention as prefill chunks then decode steps and compares.

Exit 77 (skipped) when torch, transformers or safetensors is missing.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
except ImportError as e:  # a broken install or an API change fails instead of skipping
    print(f"skipping: {e}")
    sys.exit(77)

VARIANTS = [
    dict(name="q_lora_yarn_interleave_bias", q_lora=24, interleave=True, yarn=True, bias=True),
    dict(name="q_proj_yarn_rotate_half", q_lora=None, interleave=False, yarn=True, bias=False),
    dict(name="q_lora_default_rope_interleave", q_lora=24, interleave=True, yarn=False, bias=False),
]
DIMS = dict(hidden_size=40, num_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)
SEQ_LENS = [9, 4, 13]


def dump(v, out_dir, seed):
    torch.manual_seed(seed)
    rp = {"rope_type": "default", "rope_theta": 10000.0}
    if v["yarn"]:
        rp = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4096,
              "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0}
    cfg = DeepseekV3Config(
        vocab_size=64, hidden_size=DIMS["hidden_size"], intermediate_size=32, moe_intermediate_size=16,
        num_hidden_layers=1, num_attention_heads=DIMS["num_heads"], num_key_value_heads=DIMS["num_heads"],
        q_lora_rank=v["q_lora"], kv_lora_rank=DIMS["kv_lora_rank"], qk_nope_head_dim=DIMS["qk_nope_head_dim"],
        qk_rope_head_dim=DIMS["qk_rope_head_dim"], v_head_dim=DIMS["v_head_dim"],
        max_position_embeddings=16384, rms_norm_eps=1e-6, rope_parameters=rp, rope_interleave=v["interleave"],
        attention_bias=v["bias"])
    cfg._attn_implementation = "eager"
    attn = ds.DeepseekV3Attention(cfg, 0).float().eval()
    rot = ds.DeepseekV3RotaryEmbedding(cfg)
    tensors = {}
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if "layernorm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.uniform_(-0.2, 0.2)
            else:
                a = 1.6 / math.sqrt(p.shape[1])
                p.uniform_(-a, a)
            tensors["model.layers.0.self_attn." + name] = p.detach().clone().contiguous()
    io = {}
    with torch.no_grad():
        for s, n in enumerate(SEQ_LENS):
            x = torch.randn(1, n, DIMS["hidden_size"])
            pos = torch.arange(n)[None]
            cos, sin = rot(x, pos)
            mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
            out, _ = attn(x, (cos, sin), mask)
            io[f"x{s}"] = x[0].contiguous()
            io[f"out{s}"] = out[0].contiguous()
    os.makedirs(os.path.join(out_dir, "io"), exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))
    save_file(io, os.path.join(out_dir, "io", "model.safetensors"))
    spec = dict(DIMS, q_lora_rank=v["q_lora"] or 0, rope_interleave=v["interleave"], attention_bias=v["bias"],
                rope_theta=10000.0, yarn=rp if v["yarn"] else None, seq_lens=SEQ_LENS,
                scaling=attn.scaling)
    with open(os.path.join(out_dir, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--test-bin", required=True)
    args = ap.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="shardlm_mla_hf_") as tmp:
        for i, v in enumerate(VARIANTS):
            d = os.path.join(tmp, v["name"])
            dump(v, d, 100 + i)
            env = dict(os.environ, SHARDLM_MLA_HF_DUMP=d)
            r = subprocess.run([args.test_bin, "--gtest_filter=MlaHf.*"], env=env, capture_output=True, text=True)
            ok = r.returncode == 0 and "[  PASSED  ] 1 test" in r.stdout
            print(f"{v['name']}: {'ok' if ok else 'FAILED'}")
            if not ok:
                print(r.stdout[-4000:], r.stderr[-2000:])
                failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
