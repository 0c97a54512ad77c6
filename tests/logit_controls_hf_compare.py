#!/usr/bin/env python3
"""Compares `shardlm run`'s greedy outputs under vLLM's logit controls (logit_bias,
allowed_token_ids, min_tokens) with Hugging Face transformers' own `generate` on the same weights.

transformers applies the same controls with its logits processors: `sequence_bias` of one-token
sequences adds a bias to a token's logit (logit_bias), `prefix_allowed_tokens_fn` masks every other
token to -inf (allowed_token_ids), and `min_new_tokens` masks the end tokens (its eos_token_id list:
the model's EOS, and the request's stop_token_ids) until that many tokens are generated
(min_tokens, which bars vLLM's stop tokens). Greedy choices do not depend on the order of these
(each adds a bias or -inf), so generate's tokens are the reference. Both sides stop at an end token
and keep it in the output.

Cases per prompt: a bias that bars the plain greedy output's first token and raises others; a set of
allowed tokens; EOS biased to be the likeliest token with min_tokens 5 (so the output is 5 tokens
and EOS); and all three with a stop token id in place of EOS (ignore_eos).

A row passes when its tokens equal generate's. Where they part, it still passes if generate's
processed scores of the two tokens at that step are within TIE (shardlm's logits differ from
transformers' by a few 1e-5): the rest of that row is not compared. At most a quarter of the rows may
end so. Each control must change at least half of its outputs from the plain greedy ones.

Models: stories260K (text prompts) when ../shared is present, and make-model's random tiny Llama
(random prompt ids). Exit code 77 (CTest: skipped) without torch, transformers or h5py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import h5py  # noqa: F401  (hf_compare reads the outputs with it)
    import numpy as np
    import torch
    import transformers
except ImportError as e:  # pragma: no cover
    print(f"logit_controls_hf_compare: skipped, {e.name} is not installed (pip install torch transformers h5py)")
    sys.exit(77)

import hf_compare  # noqa: E402  (make-model, the run, the driver)

TIE = 2e-4
MAX_TOKENS = 16
MIN_TOKENS = 5
STORY_PROMPTS = ["Once upon a time", "Lily and Ben", "The cat sat", "One day, a little"]


def generate(model, prompt, eos, bias=None, allowed=None, min_new=0, max_new=MAX_TOKENS):
    """transformers' greedy continuation of prompt and its processed scores per step."""
    kw = {}
    if bias:
        kw["sequence_bias"] = [[[t], float(b)] for t, b in bias.items()]
    if allowed:
        kw["prefix_allowed_tokens_fn"] = lambda batch, ids: allowed
    if min_new:
        kw["min_new_tokens"] = min_new
    ids = torch.tensor([prompt])
    with torch.no_grad():
        # The mask given: generate would otherwise mask every prompt id equal to the pad id.
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=eos, pad_token_id=0, return_dict_in_generate=True, output_scores=True, **kw)
    return out.sequences[0, len(prompt):].tolist(), [s[0] for s in out.scores]


def read_rows(path, name):
    return hf_compare.token_rows(path, "logit_controls_hf_compare", name)


def check_model(binary, model_dir, name, prompts, workdir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    vocab = model.config.vocab_size
    eos = model.config.eos_token_id
    rng = np.random.default_rng(11)
    # The prompts' ids (shardlm tokenizes text prompts; its prompt_tokens say how) and the plain
    # greedy outputs, which the cases are built around.
    plain_rows = read_rows(hf_compare.run_requests(
        binary, model_dir, [dict(p, id=f"p{j}", max_tokens=MAX_TOKENS, ignore_eos=True) for j, p in enumerate(prompts)],
        workdir, name + "-plain"), name)
    requests, refs = [], {}
    for j, p in enumerate(prompts):
        prompt, plain = plain_rows[f"p{j}"]
        others = [int(t) for t in rng.choice(vocab, size=40, replace=False) if t != eos]
        bias = {plain[0]: -100.0, plain[2]: -3.0, others[0]: 6.0, others[1]: 3.5}
        allowed = sorted(set(others[2:26]) | {plain[1]})
        stop = others[26]
        cases = {
            "bias": ({"logit_bias": {str(t): b for t, b in bias.items()}, "ignore_eos": True},
                     dict(eos=None, bias=bias)),
            "allowed": ({"allowed_token_ids": allowed, "ignore_eos": True}, dict(eos=None, allowed=allowed)),
            "min": ({"logit_bias": {str(eos): 100.0}, "min_tokens": MIN_TOKENS},
                    dict(eos=[eos], bias={eos: 100.0}, min_new=MIN_TOKENS)),
            "all": ({"logit_bias": {str(stop): 50.0, str(others[2]): 2.0}, "allowed_token_ids": allowed + [stop],
                     "min_tokens": MIN_TOKENS + 2, "stop_token_ids": [stop], "ignore_eos": True},
                    dict(eos=[stop], bias={stop: 50.0, others[2]: 2.0}, allowed=allowed + [stop],
                         min_new=MIN_TOKENS + 2)),
        }
        for case, (fields, ref) in cases.items():
            rid = f"{case}-p{j}"
            requests.append(dict(p, id=rid, max_tokens=MAX_TOKENS, **fields))
            refs[rid] = (case, prompt, plain, ref)
    rows = read_rows(hf_compare.run_requests(binary, model_dir, requests, workdir, name + "-controls"), name)
    ok = True
    exact = tied = 0
    moved = {}
    for rid, (case, prompt, plain, ref) in refs.items():
        _, ours = rows[rid]
        want, scores = generate(model, prompt, **ref)
        moved[case] = moved.get(case, 0) + (want != plain)
        if ours == want:
            exact += 1
        else:
            i = next((k for k in range(min(len(ours), len(want))) if ours[k] != want[k]), None)
            gap = abs(float(scores[i][want[i]] - scores[i][ours[i]])) if i is not None else float("inf")
            if gap <= TIE:
                tied += 1
                print(f"  {name} {rid}: parts at token {i} on a near tie ({gap:.2e})")
            else:
                ok = False
                print(f"  {name} {rid}: shardlm {ours} transformers {want}")
        # What each control must show, on generate's side too (so the reference is of the controls).
        if case == "allowed" or case == "all":
            ok &= all(t in ref["allowed"] for t in want)
        if case == "min":
            ok &= len(want) == MIN_TOKENS + 1 and want[-1] == eos and eos not in want[:-1]
        if case == "all":
            ok &= len(want) == MIN_TOKENS + 3 and want[-1] == ref["eos"][0]
    total = len(refs)
    print(f"{name}: {exact} of {total} rows equal transformers' generate, {tied} part on a near tie; the controls "
          f"change " + ", ".join(f"{c} {n} of {len(prompts)}" for c, n in moved.items()) + " greedy outputs")
    for case, n in moved.items():
        if n * 2 < len(prompts):
            print(f"  {name}: {case} changes too few outputs to test it")
            ok = False
    return ok and tied * 4 <= total


if __name__ == "__main__":
    sys.exit(hf_compare.check_stories_and_tiny_llama("logit_controls_hf_compare", check_model, STORY_PROMPTS, 5,
                                                     [3, 9, 24]))
