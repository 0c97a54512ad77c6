#!/usr/bin/env python3
"""Compares shardlm's logits with Hugging Face transformers on the same weights.

For every tiny config in inputs/models (Llama with llama3 RoPE scaling, Qwen2 with q/k/v bias and
tied embeddings, Qwen3 with QK-norm and head_dim != hidden/heads, Mistral with a sliding window
shorter than the sequence; Mixtral, Qwen2-MoE with its gated shared expert, Qwen3-MoE with a dense
mlp_only layer, DeepSeek-V3 with MLA, YaRN, group-limited sigmoid routing and a dense first layer,
and a Kimi-K2-shaped model with one expert group), in fp32 and bf16 weights (and fp8 block-scaled
for the DeepSeek-V3 shapes), make-model writes a random checkpoint; `shardlm score` and
transformers (fp32 math, eager attention) each compute the logits at every position of the same
token sequence. Also Qwen2, Qwen3, Qwen2-MoE and Qwen3-MoE with a sliding window over some of their
layers, and stories260K when ../shared is present.

For fp8 checkpoints the reference model gets the weights dequantised by the reference formula
(fp8 -> fp32, times the block's scale_inv, rounded to bf16) in torch.

Passes when, for every model, max |logit difference| <= ATOL + RTOL * max |logit| and the argmax
agrees at every position whose top-2 margin exceeds that tolerance. Prints the figures.

Exit code 77 (CTest: skipped) when torch or transformers is not installed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import transformers
except ImportError as e:  # pragma: no cover
    print(f"hf_compare: skipped, {e.name} is not installed (pip install torch transformers)")
    sys.exit(77)

ATOL = 1e-4
RTOL = 1e-5
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shardlm_logits(binary, model_dir, ids, workdir):
    out = os.path.join(workdir, "logits.npy")
    subprocess.run([binary, "score", "--model", model_dir, "--ids", " ".join(map(str, ids)), "--out", out],
                   check=True)
    return np.load(out)


def hf_loadable(model_dir, workdir):
    """A copy of model_dir that transformers loads natively: fp8 weights dequantised to bf16 (and
    quantization_config dropped), Kimi's model_type mapped to deepseek_v3. model_dir itself when
    nothing needs changing."""
    import shutil
    from safetensors.torch import load_file, save_file
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    if "quantization_config" not in config and config.get("model_type") != "kimi_k2":
        return model_dir
    out = os.path.join(workdir, os.path.basename(model_dir) + "-hf")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(model_dir, out, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    plain = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            s = tensors[name + "_scale_inv"].float()
            rows, cols = t.shape
            scale = s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
            t = (t.float() * scale).to(torch.bfloat16)
        plain[name] = t
    save_file(plain, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config.pop("quantization_config", None)
    if config.get("model_type") == "kimi_k2":
        config["model_type"] = "deepseek_v3"
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return out


def hf_logits(model_dir, ids, workdir=None):
    if workdir is not None:
        model_dir = hf_loadable(model_dir, workdir)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                                    attn_implementation="eager",
                                                                    output_loading_info=True)
    # A weight transformers did not find would be randomly initialised: the comparison would be void.
    missing = [k for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)]
    if missing:
        raise SystemExit(f"hf_compare: transformers did not load {model_dir} cleanly: "
                         + "; ".join(f"{k}: {sorted(info[k])[:8]}" for k in missing))
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long))
    return out.logits[0].float().numpy()


def compare(name, ours, ref):
    diff = np.abs(ours - ref)
    scale = float(np.abs(ref).max())
    tol = ATOL + RTOL * scale
    top2 = np.sort(ref, axis=-1)[:, -2:]
    decisive = (top2[:, 1] - top2[:, 0]) > 2 * tol
    agree = (ours.argmax(-1) == ref.argmax(-1))[decisive]
    ok = diff.max() <= tol and agree.all()
    print(f"{name:32s} T={ours.shape[0]:4d} max|diff|={diff.max():.3e} mean|diff|={diff.mean():.3e} "
          f"max|logit|={scale:7.3f} tol={tol:.1e} argmax agree {agree.sum()}/{agree.size}  {'ok' if ok else 'FAIL'}")
    return ok


MODELS = [("tiny-llama", ["fp32", "bf16"]), ("tiny-qwen2", ["fp32", "bf16"]), ("tiny-qwen3", ["fp32", "bf16"]),
          ("tiny-mistral", ["fp32", "bf16"]), ("tiny-mixtral", ["fp32", "bf16"]), ("tiny-qwen2-moe", ["fp32", "bf16"]),
          ("tiny-qwen3-moe", ["fp32", "bf16"]), ("tiny-deepseek-v3", ["fp32", "bf16", "fp8"]),
          ("tiny-kimi-k2", ["fp32", "bf16", "fp8"])]
# The same configs with a sliding window of 16 over the 100-token sequence, each architecture choosing
# its layers: Qwen2 from max_window_layers on, Qwen2-MoE the even layers below it, Qwen3-MoE every
# layer, and Qwen3 an explicit layer_types. And Qwen2-MoE without its q/k/v biases.
SLIDING = {"use_sliding_window": True, "sliding_window": 16}
VARIANTS = [("tiny-qwen2", "sw", dict(SLIDING, max_window_layers=2)),
            ("tiny-qwen2-moe", "sw", dict(SLIDING, max_window_layers=3)),
            ("tiny-qwen3-moe", "sw", SLIDING),
            ("tiny-qwen3", "layer-types", dict(SLIDING, layer_types=["sliding_attention", "full_attention"] * 2)),
            ("tiny-qwen2-moe", "no-qkv-bias", {"qkv_bias": False})]
# make-model writes the same tokenizer for every config: checking four is plenty.
TOKENIZER_CHECKED = {"tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"}

TOKENIZER_TEXTS = ["Once upon a time, there was a little girl named Lily.",
                   "  leading spaces, tabs\tand\nnewlines  ", "Caf\u00e9 na\u00efve \u4f60\u597d\u4e16\u754c 123456 don't",
                   "\U0001F642 emoji and \u00c5ngstr\u00f6m"]


def compare_tokenizer(name, binary, model_dir):
    """shardlm tokenize against transformers' fast tokenizer on the same tokenizer.json."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ok = True
    for text in TOKENIZER_TEXTS:
        ours = subprocess.run([binary, "tokenize", "--model", model_dir, "--text", text], check=True,
                              capture_output=True, text=True).stdout.split()
        ref = tok.encode(text, add_special_tokens=False)
        if [int(x) for x in ours] != ref:
            ok = False
            print(f"  tokenizer mismatch on {text!r}: shardlm {ours} transformers {ref}")
    print(f"{name + ' tokenizer':32s} {len(TOKENIZER_TEXTS)} texts {'ok' if ok else 'FAIL'}")
    return ok


def run_requests(binary, model_dir, requests, workdir, name, flags=()):
    """Writes requests (dicts) as a JSONL prompt file, runs `shardlm run` on it; the HDF5 output's path."""
    prompts = os.path.join(workdir, name + ".jsonl")
    with open(prompts, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    out = os.path.join(workdir, name + ".h5")
    subprocess.run([binary, "run", "--model", model_dir, "--prompts", prompts, "--out", out, "-q", *flags],
                   check=True, capture_output=True)
    return out


def read_rows(path, script, name, columns):
    """Each /requests row of an HDF5 output as {id: {column: numpy array}}; an error row ends the
    script, naming it."""
    import h5py
    import numpy as np
    rows = {}
    with h5py.File(path, "r") as h:
        req = h["requests"]
        for i in range(len(req["id"])):
            err = req["error"][i].decode()
            if err:
                raise SystemExit(f"{script}: {name} row {req['id'][i].decode()}: {err}")
            rows[req["id"][i].decode()] = {k: np.array(req[k][i]) for k in columns}
    return rows


def token_rows(path, script, name):
    """Each row's prompt and output tokens as lists: {id: (prompt_tokens, output_tokens)}."""
    rows = read_rows(path, script, name, ("prompt_tokens", "output_tokens"))
    return {k: ([int(x) for x in v["prompt_tokens"]], [int(x) for x in v["output_tokens"]]) for k, v in rows.items()}


def check_stories_and_tiny_llama(script, check_model, story_prompts, seed, id_lengths):
    """The driver of a request-level comparison: check_model(binary, model_dir, name, prompts, workdir) on
    stories260K's text prompts (when ../shared is present) and on make-model's random tiny Llama with
    random prompt ids of id_lengths; the exit code."""
    args = arg_parser().parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        stories = os.path.join(args.shared, "models", "stories260K")
        if os.path.isdir(stories):
            ok &= check_model(args.shardlm, stories, "stories260K", [{"prompt": p} for p in story_prompts], tmp)
        else:
            print(f"stories260K: skipped, {stories} is absent")
        rng = np.random.default_rng(seed)
        d = os.path.join(tmp, "tiny-llama")
        ids = make_model(args.shardlm, "tiny-llama", d, "fp32", rng, max(id_lengths))
        ok &= check_model(args.shardlm, d, "tiny-llama", [{"prompt_token_ids": ids[:n]} for n in id_lengths], tmp)
    print(f"{script}:", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


def arg_parser():
    """The options every transformers comparison takes."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(ROOT), "shared"))
    ap.add_argument("--tokens", type=int, default=100)
    return ap


def make_model(binary, cfg, out, dtype, rng, tokens, patch=None):
    """make-model's random checkpoint of inputs/models/CFG.json (its fields in PATCH replaced) in OUT,
    and `tokens` random ids."""
    config = os.path.join(ROOT, "inputs", "models", cfg + ".json")
    if patch:
        with open(config) as f:
            fields = json.load(f)
        fields.update(patch)
        config = out + ".config.json"
        with open(config, "w") as f:
            json.dump(fields, f)
    subprocess.run([binary, "make-model", "--config", config, "--out", out, "--dtype", dtype, "--seed", "3"],
                   check=True, capture_output=True)
    with open(os.path.join(out, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return [int(x) for x in rng.integers(0, vocab, size=tokens)]


def stories_ids(stories, n=150):
    """BOS and the first n tokens of stories260K's reference greedy continuation."""
    with open(os.path.join(stories, "expected_greedy_from_bos.ids")) as f:
        return [1] + [int(x) for x in f.read().split()][:n]


def main():
    ap = arg_parser()
    ap.add_argument("--only", nargs="*", help="config names to run (default: all)")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    ok = True
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for cfg, dtypes in MODELS:
            if args.only and cfg not in args.only:
                continue
            for dtype in dtypes:
                d = os.path.join(tmp, f"{cfg}-{dtype}")
                ids = make_model(args.shardlm, cfg, d, dtype, rng, args.tokens)
                ok &= compare(f"{cfg} {dtype}", shardlm_logits(args.shardlm, d, ids, tmp), hf_logits(d, ids, tmp))
            if cfg in TOKENIZER_CHECKED:
                ok &= compare_tokenizer(cfg, args.shardlm, d)
        for cfg, variant, patch in VARIANTS:
            if args.only and cfg not in args.only:
                continue
            d = os.path.join(tmp, f"{cfg}-{variant}")
            ids = make_model(args.shardlm, cfg, d, "fp32", rng, args.tokens, patch)
            ok &= compare(f"{cfg} {variant} fp32", shardlm_logits(args.shardlm, d, ids, tmp), hf_logits(d, ids, tmp))
        stories = os.path.join(args.shared, "models", "stories260K")
        if args.only:
            pass
        elif os.path.isdir(stories):
            ids = stories_ids(stories)
            ok &= compare("stories260K fp32", shardlm_logits(args.shardlm, stories, ids, tmp), hf_logits(stories, ids))
        else:
            print(f"stories260K: skipped, {stories} is absent")
    print("hf_compare:", "all models match" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
