#!/usr/bin/env python3
"""Compares shardlm's fp8 and bf16 KV caches with Hugging Face transformers on the same weights.

`shardlm score --kv-dtype fp8` attends over keys and values stored as e4m3fn codes of
value / scale and read back as code * scale. The reference is transformers (fp32 math, eager
attention) with an attention function that does exactly that to the keys (after RoPE, as they are
cached) and values with torch's own float8_e4m3fn conversion, then runs the model's own eager
attention function. Likewise bf16 with torch's bfloat16 rounding. The models: stories260K when ../shared is
present, and make-model's tiny GQA configs (Llama, Qwen2 with q/k/v bias, Qwen3 with QK-norm,
Mistral with a sliding window, Mixtral). For fp8 also a copy of each checkpoint that carries
per-layer `self_attn.k_scale` / `v_scale` tensors (vLLM's names), scales shardlm must read and
apply as the reference applies them.

Passes when, for every case, the logits agree within hf_compare.py's tolerance, or, where a key
rounds to a neighbouring code on one side only (its fp32 value differs in the last bits between
the two implementations), the difference stays a small share of what the narrow cache itself
moves the logits by (see compare). Prints the figures.

Exit code 77 (CTest: skipped) when torch, transformers or safetensors is not installed.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:  # pragma: no cover
    print(f"kv_cache_hf_compare: skipped, {e.name} is not installed (pip install torch transformers safetensors)")
    sys.exit(77)
if not hasattr(torch, "float8_e4m3fn"):  # pragma: no cover
    print(f"kv_cache_hf_compare: skipped, torch {torch.__version__} has no float8_e4m3fn")
    sys.exit(77)

import hf_compare  # noqa: E402  (the same tolerance and comparison)

# Shares of the narrow cache's own shift of the logits that a difference from the reference may
# reach when it is past hf_compare's tolerance (see compare).
MEAN_SHARE, MAX_SHARE = 0.20, 0.50
CONFIGS = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-mixtral"]

# The cache the reference attention emulates: (dtype, {layer: (k_scale, v_scale)}).
_cache = {"dtype": None, "scales": {}}


def narrow(x, dtype, scale):
    if dtype == "bf16":
        return x.to(torch.bfloat16).float()
    return (x / scale).to(torch.float8_e4m3fn).float() * scale


def patch_eager_attention(model):
    """Makes the model's eager attention read keys and values as the narrow cache holds them. The
    modeling module looks its eager_attention_forward up at every call, and the masks stay eager's."""
    mod = sys.modules[type(model).__module__]
    if getattr(mod, "_narrow_kv_original", None) is None:
        mod._narrow_kv_original = mod.eager_attention_forward

        def cached(module, query, key, value, attention_mask, **kwargs):
            dtype = _cache["dtype"]
            if dtype is not None:
                ks, vs = _cache["scales"].get(module.layer_idx, (1.0, 1.0))
                key = narrow(key, dtype, torch.tensor(ks, dtype=torch.float32))
                value = narrow(value, dtype, torch.tensor(vs, dtype=torch.float32))
            return mod._narrow_kv_original(module, query, key, value, attention_mask, **kwargs)

        mod.eager_attention_forward = cached


def hf_logits(model_dir, ids, dtype, scales):
    _cache["dtype"], _cache["scales"] = dtype, scales
    model, info = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                                    attn_implementation="eager",
                                                                    output_loading_info=True)
    bad = [k for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)]
    if bad:
        raise SystemExit(f"kv_cache_hf_compare: transformers did not load {model_dir} cleanly: {bad}")
    patch_eager_attention(model)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([ids], dtype=torch.long)).logits[0].float().numpy()


def shardlm_logits(binary, model_dir, ids, kv_dtype, workdir):
    out = os.path.join(workdir, "logits.npy")
    subprocess.run([binary, "score", "--model", model_dir, "--ids", " ".join(map(str, ids)), "--out", out,
                    "--kv-dtype", kv_dtype], check=True)
    return np.load(out)


def with_scales(model_dir, workdir, scales):
    """A copy of model_dir whose checkpoint also holds self_attn.k_scale / v_scale per layer."""
    out = os.path.join(workdir, os.path.basename(model_dir) + "-scaled")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(model_dir, out)
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    for layer, (ks, vs) in scales.items():
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(ks, dtype=torch.float32)
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(vs, dtype=torch.float32)
    save_file(tensors, path, metadata={"format": "pt"})
    return out


def compare(name, ours, ref, base):
    """Within hf_compare's tolerance, with the argmax agreeing wherever the top-2 margin exceeds it;
    or else, for keys whose fp32 values differ in their last bits between the two implementations
    (different summation orders) and so, rarely, round to neighbouring codes, each moving the later
    logits a little: the difference must stay small beside what the narrow cache itself does to
    the logits (ours - base), which a wrong rounding or scale is comparable to (measured: a
    truncating fp8 conversion, or the checkpoint's scales left out, gives 53% to 283% of it)."""
    diff, shift = np.abs(ours - ref), np.abs(ours - base)
    tol = hf_compare.ATOL + hf_compare.RTOL * float(np.abs(ref).max())
    top2 = np.sort(ref, axis=-1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    same_argmax = ours.argmax(-1) == ref.argmax(-1)
    line = f"{name:30s} T={ours.shape[0]:4d} max|diff|={diff.max():.2e} mean|diff|={diff.mean():.2e} tol={tol:.1e}"
    if diff.max() <= tol and same_argmax[margin > 2 * tol].all():
        print(f"{line}  ok")
        return True
    mean_share, max_share = diff.mean() / shift.mean(), diff.max() / shift.max()
    ok = bool(same_argmax[margin > 0.5].all()) and mean_share <= MEAN_SHARE and max_share <= MAX_SHARE
    print(f"{line}; {int((diff > tol).any(axis=-1).sum())} positions past tol: mean|diff| {100 * mean_share:.2f}% "
          f"of the cache's mean shift (<= {100 * MEAN_SHARE:.0f}%), max {100 * max_share:.1f}% "
          f"(<= {100 * MAX_SHARE:.0f}%), argmax same where the margin is over 0.5  {'ok' if ok else 'FAIL'}")
    return ok


def run_model(args, name, model_dir, ids, tmp):
    with open(os.path.join(model_dir, "config.json")) as f:
        layers = json.load(f)["num_hidden_layers"]
    ok = True
    base = shardlm_logits(args.shardlm, model_dir, ids, "fp32", tmp)
    for dtype in ("bf16", "fp8"):
        ours = shardlm_logits(args.shardlm, model_dir, ids, dtype, tmp)
        print(f"{name} {dtype} cache: moves the logits from the fp32 cache's by max "
              f"{np.abs(ours - base).max():.2e}, mean {np.abs(ours - base).mean():.2e}")
        ok &= compare(f"{name} {dtype} cache", ours, hf_logits(model_dir, ids, dtype, {}), base)
    # Scales that differ per layer and side, neither powers of two nor near 1.
    scales = {layer: (0.0117 * (layer + 1), 0.0043 * (layer + 2)) for layer in range(layers)}
    scaled = with_scales(model_dir, tmp, scales)
    ours = shardlm_logits(args.shardlm, scaled, ids, "fp8", tmp)
    ok &= compare(f"{name} fp8, ckpt scales", ours, hf_logits(model_dir, ids, "fp8", scales),
                  shardlm_logits(args.shardlm, scaled, ids, "fp32", tmp))
    unscaled = hf_logits(model_dir, ids, "fp8", {})
    if np.abs(ours - unscaled).max() == 0:
        print(f"{name}: the checkpoint's scales changed nothing: FAIL")
        ok = False
    return ok


def main():
    args = hf_compare.arg_parser().parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    ok = True
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in CONFIGS:
            d = os.path.join(tmp, cfg)
            ok &= run_model(args, cfg, d, hf_compare.make_model(args.shardlm, cfg, d, "fp32", rng, args.tokens), tmp)
        stories = os.path.join(args.shared, "models", "stories260K")
        if os.path.isdir(stories):
            ok &= run_model(args, "stories260K", stories, hf_compare.stories_ids(stories), tmp)
        else:
            print(f"stories260K: skipped, {stories} is absent")
    print("kv_cache_hf_compare:", "every cache matches" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
