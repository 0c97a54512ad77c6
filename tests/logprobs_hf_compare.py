#!/usr/bin/env python3
"""Compares `shardlm run`'s logprobs and prompt_logprobs (vLLM's request fields) with Hugging Face
transformers' log-softmax of its logits for the same weights.

For every request the reference runs one forward of the transformers model (fp32, eager attention)
over the prompt and shardlm's output, and takes log_softmax of each position's logits:
  - prompt_logprobs[t] must be the reference's logprob of prompt token t after tokens [0, t), NaN
    for t = 0 (vLLM's None);
  - token_logprobs[i] that of output token i;
  - the N top alternatives at each prompt and output position must be the reference's N most likely
    tokens, most likely first, with their logprobs.
Logprobs must agree within TOL (hf_compare.py's logits tolerance is a few 1e-5). An alternative's id
may differ from the reference's only where the two candidates' reference logprobs are within TIE
(fp32 sums in another order can swap them); such swaps are counted and printed.

Requests are greedy with ignore_eos. A long prompt with prompt logprobs is run with a small
--max-seqs so that its score rows span several steps, and one request asks for prompt_logprobs 0
(the prompt tokens' logprobs without alternatives). The sum of a continuation's prompt logprobs is
what lm-evaluation-harness reads as a log-likelihood: it is checked too.

Models: stories260K (text prompts) when ../shared is present, and make-model's random tiny Llama.
Exit code 77 (CTest: skipped) without torch, transformers or h5py.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import h5py  # noqa: F401  (hf_compare reads the outputs with it)
    import numpy as np
    import torch
    import transformers
except ImportError as e:  # pragma: no cover
    print(f"logprobs_hf_compare: skipped, {e.name} is not installed (pip install torch transformers h5py)")
    sys.exit(77)

import hf_compare  # noqa: E402  (make-model, the options)

TOL = 1e-4
TIE = 2e-4
MAX_TOKENS = 12
STORY_PROMPTS = ["Once upon a time", "Lily and Ben went to the park to play with a big red ball",
                 "The cat sat", "One day, a little girl named Lily found a needle in her room."]


def run_shardlm(binary, model_dir, requests, workdir, name, flags=()):
    out = hf_compare.run_requests(binary, model_dir, requests, workdir, name, flags)
    return hf_compare.read_rows(out, "logprobs_hf_compare", name, (
        "prompt_tokens", "output_tokens", "token_logprobs", "top_token_ids", "top_logprobs", "prompt_logprobs",
        "prompt_top_token_ids", "prompt_top_logprobs"))


def reference_logprobs(model, ids):
    """log_softmax of the logits at every position of ids, in float64 of the fp32 logits: [T, vocab]."""
    with torch.no_grad():
        logits = model(torch.tensor([ids], dtype=torch.long)).logits[0].float()
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def top_of(lp, n):
    """The n most likely ids of one row, ties to the lower id (as shardlm orders candidates)."""
    order = np.lexsort((np.arange(lp.shape[0]), -lp))
    return order[:n]


class Tally:
    def __init__(self):
        self.values = 0
        self.worst = 0.0
        self.swaps = 0
        self.bad = []

    def logprob(self, what, got, want):
        self.values += 1
        d = abs(float(got) - float(want))
        self.worst = max(self.worst, d)
        if not d <= TOL:
            self.bad.append(f"{what}: {float(got):.6f} vs {float(want):.6f}")

    def alternatives(self, what, ids, lps, ref_row, n):
        want = top_of(ref_row, n)
        for k in range(n):
            self.logprob(f"{what} alternative {k}", lps[k], ref_row[want[k]])
            if ids[k] != want[k]:
                if abs(float(ref_row[ids[k]]) - float(ref_row[want[k]])) <= TIE:
                    self.swaps += 1
                else:
                    self.bad.append(f"{what} alternative {k}: id {ids[k]} vs {want[k]}")


def check_row(name, rid, row, ref, top_n, prompt_n, t):
    prompt = row["prompt_tokens"]
    out = row["output_tokens"]
    P = len(prompt)
    if len(out) != MAX_TOKENS:
        t.bad.append(f"{name} {rid}: {len(out)} tokens, not {MAX_TOKENS}")
        return
    for i in range(len(out)):
        # Output token i was chosen from the logits at position P - 1 + i; greedy takes the argmax.
        lp_row = ref[P - 1 + i]
        t.logprob(f"{name} {rid} output {i}", row["token_logprobs"][i], lp_row[out[i]])
        if top_n:
            t.alternatives(f"{name} {rid} output {i}", row["top_token_ids"][i * top_n:(i + 1) * top_n],
                           row["top_logprobs"][i * top_n:(i + 1) * top_n], lp_row, top_n)
    if top_n == 0 and len(row["top_token_ids"]):
        t.bad.append(f"{name} {rid}: alternatives written without logprobs")
    if prompt_n < 0:
        if len(row["prompt_logprobs"]):
            t.bad.append(f"{name} {rid}: prompt logprobs written without prompt_logprobs")
        return
    pl = row["prompt_logprobs"]
    if len(pl) != P or not math.isnan(pl[0]):
        t.bad.append(f"{name} {rid}: prompt_logprobs of {len(pl)} values for {P} prompt tokens, first {pl[:1]}")
        return
    if len(row["prompt_top_token_ids"]) != P * prompt_n:
        t.bad.append(f"{name} {rid}: {len(row['prompt_top_token_ids'])} prompt alternatives, not {P} x {prompt_n}")
        return
    for p in range(1, P):
        t.logprob(f"{name} {rid} prompt {p}", pl[p], ref[p - 1][prompt[p]])
        if prompt_n:
            t.alternatives(f"{name} {rid} prompt {p}", row["prompt_top_token_ids"][p * prompt_n:(p + 1) * prompt_n],
                           row["prompt_top_logprobs"][p * prompt_n:(p + 1) * prompt_n], ref[p - 1], prompt_n)
    # lm-evaluation-harness's log-likelihood of a continuation: the sum over its prompt tokens.
    half = P // 2
    got = float(np.sum(pl[half:].astype(np.float64)))
    want = float(sum(ref[p - 1][prompt[p]] for p in range(half, P)))
    if not abs(got - want) <= TOL * (P - half):
        t.bad.append(f"{name} {rid}: continuation log-likelihood {got:.6f} vs {want:.6f}")


def check_model(binary, model_dir, name, prompts, workdir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    # (logprobs, prompt_logprobs) per case; -1: not asked.
    cases = [(5, 5), (0, 0), (20, -1), (1, 3)]
    requests = []
    for k, (top_n, prompt_n) in enumerate(cases):
        for j, p in enumerate(prompts):
            r = {"id": f"c{k}p{j}", "max_tokens": MAX_TOKENS, "ignore_eos": True, "logprobs": top_n}
            if prompt_n >= 0:
                r["prompt_logprobs"] = prompt_n
            r.update(p)
            requests.append(r)
    t = Tally()
    checked = 0
    # Two schedules: the prompts' score rows in one step each, and spread over many steps of a few rows.
    for flags in ([], ["--max-seqs", "3", "--max-batch-tokens", "16"]):
        rows = run_shardlm(binary, model_dir, requests, workdir, f"{name}-{len(flags)}", flags)
        for r in requests:
            row = rows[r["id"]]
            ids = [int(x) for x in row["prompt_tokens"]] + [int(x) for x in row["output_tokens"]]
            ref = reference_logprobs(model, ids)
            check_row(name, r["id"], row, ref, r["logprobs"], r.get("prompt_logprobs", -1), t)
            checked += 1
    for b in t.bad[:20]:
        print("  " + b)
    print(f"{name}: {checked} rows, {t.values} logprobs within {t.worst:.2e} of transformers' (tolerance {TOL:g}), "
          f"{t.swaps} alternatives swapped on near ties, {len(t.bad)} failures")
    return not t.bad and t.values > 0


def main():
    return hf_compare.check_stories_and_tiny_llama("logprobs_hf_compare", check_model, STORY_PROMPTS, 7, (2, 9, 40))


if __name__ == "__main__":
    sys.exit(main())
