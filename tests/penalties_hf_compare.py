#!/usr/bin/env python3
"""Compares `shardlm run`'s greedy outputs under repetition, frequency and presence penalties with
a reference on Hugging Face transformers' logits for the same weights.

The reference decodes greedily, one full forward of the transformers model (fp32, eager attention)
per token, and penalizes each step's last logits as vLLM's sampler does before its argmax (its
apply_penalties, written here in torch): the repetition penalty on every token of the prompt or the
output so far (a positive logit divided by it, any other multiplied), then the frequency penalty
times each token's count in the output, then the presence penalty on every output token, each in
fp32. The repetition-only case is also decoded by transformers' own `generate` (its
RepetitionPenaltyLogitsProcessor, the same rule over the prompt and the output), so the loop is tied
to a peer's implementation.

Models: stories260K (text prompts, BOS prepended by shardlm) when ../shared is present, and
make-model's random tiny Llama (random prompt ids). Every request sets ignore_eos, so each row is
max_tokens long. The penalties come as request fields, and in one run as the command line's
--repetition-penalty / --frequency-penalty / --presence-penalty.

A row passes when its tokens equal the reference's. Where they part, the row still passes if the
reference's penalized logits of the two tokens at that step are within TIE of each other (shardlm's
logits differ from transformers' by up to a few 1e-5, hf_compare.py's tolerance): the rest of that
row is then not compared. Such rows are counted and printed; at most a quarter may end so. The
penalties must change at least half of the outputs from plain greedy ones, so that the comparison
tells them from none.

Exit code 77 (CTest: skipped) without torch, transformers or h5py.
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
    print(f"penalties_hf_compare: skipped, {e.name} is not installed (pip install torch transformers h5py)")
    sys.exit(77)

import hf_compare  # noqa: E402  (make-model, the options)

TIE = 2e-4
MAX_TOKENS = 32
# (repetition, frequency, presence) per case.
CASES = [(1.3, 0.0, 0.0), (0.8, 0.0, 0.0), (1.0, 0.9, 0.0), (1.0, 0.0, 1.2), (1.1, -0.5, 0.5), (1.0, 2.0, 2.0)]
STORY_PROMPTS = ["Once upon a time", "Lily and Ben", "The cat sat", "One day, a little"]


def penalized(logits, prompt, output, rep, freq, pres):
    """vLLM's apply_penalties on one row of fp32 logits."""
    vocab = logits.shape[-1]
    prompt_mask = torch.zeros(vocab, dtype=torch.bool)
    prompt_mask[torch.tensor(prompt, dtype=torch.long)] = True
    counts = torch.zeros(vocab, dtype=torch.long)
    if output:
        counts.scatter_add_(0, torch.tensor(output, dtype=torch.long), torch.ones(len(output), dtype=torch.long))
    output_mask = counts > 0
    penalty = torch.where(prompt_mask | output_mask, torch.tensor(rep, dtype=torch.float32),
                          torch.tensor(1.0, dtype=torch.float32))
    logits = torch.where(logits > 0, logits / penalty, logits * penalty)
    logits = logits - torch.tensor(freq, dtype=torch.float32) * counts
    return logits - torch.tensor(pres, dtype=torch.float32) * output_mask


def reference_steps(model, prompt, n, rep, freq, pres):
    """The greedy continuation and each step's penalized logits."""
    ids, output, steps = list(prompt), [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids], dtype=torch.long)).logits[0, -1].float()
            p = penalized(logits, prompt, output, rep, freq, pres)
            steps.append(p)
            t = int(torch.argmax(p))
            output.append(t)
            ids.append(t)
    return output, steps


def run_shardlm(binary, model_dir, requests, workdir, name, flags=()):
    out = hf_compare.run_requests(binary, model_dir, requests, workdir, name, flags)
    return hf_compare.token_rows(out, "penalties_hf_compare", name)


def compare_rows(name, model, requests, rows, penalties_of):
    exact = tied = moved = 0
    ok = True
    for r in requests:
        prompt, ours = rows[r["id"]]
        rep, freq, pres = penalties_of(r)
        want, steps = reference_steps(model, prompt, len(ours), rep, freq, pres)
        moved += want != reference_steps(model, prompt, len(ours), 1.0, 0.0, 0.0)[0]
        if len(ours) != MAX_TOKENS:
            print(f"  {name} {r['id']}: {len(ours)} tokens, not {MAX_TOKENS}")
            ok = False
            continue
        if ours == want:
            exact += 1
            continue
        i = next(k for k in range(len(ours)) if ours[k] != want[k])
        gap = abs(float(steps[i][want[i]] - steps[i][ours[i]]))
        if gap <= TIE:
            tied += 1
            print(f"  {name} {r['id']}: parts at token {i} on a near tie ({gap:.2e})")
        else:
            ok = False
            print(f"  {name} {r['id']} (rep {rep}, freq {freq}, pres {pres}): parts at token {i}: shardlm {ours[i:i + 6]}"
                  f" reference {want[i:i + 6]} (penalized logits {float(steps[i][ours[i]]):.5f} vs "
                  f"{float(steps[i][want[i]]):.5f})")
    total = len(requests)
    print(f"{name}: {exact} of {total} rows equal the reference, {tied} part on a near tie; the penalties "
          f"change {moved} of the {total} greedy outputs")
    # A comparison the penalties did not move would not tell them from none.
    if moved * 2 < total:
        print(f"  {name}: the penalties change too few outputs to test them")
        ok = False
    return ok and tied * 4 <= total


def check_model(binary, model_dir, name, prompts, workdir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    model.generation_config.eos_token_id = None  # generate runs to max_new_tokens, as ignore_eos
    requests = []
    for k, (rep, freq, pres) in enumerate(CASES):
        for j, p in enumerate(prompts):
            r = {"id": f"c{k}p{j}", "max_tokens": MAX_TOKENS, "ignore_eos": True, "repetition_penalty": rep,
                 "frequency_penalty": freq, "presence_penalty": pres}
            r.update(p)
            requests.append(r)
    rows = run_shardlm(binary, model_dir, requests, workdir, name + "-fields")
    fields = lambda r: (r["repetition_penalty"], r["frequency_penalty"], r["presence_penalty"])  # noqa: E731
    ok = compare_rows(name + " (request fields)", model, requests, rows, fields)

    # The run's defaults from the command line, the requests without fields of their own.
    flag_case = (1.2, 0.3, 0.4)
    plain = [dict(p, id=f"f{j}", max_tokens=MAX_TOKENS, ignore_eos=True) for j, p in enumerate(prompts)]
    rows = run_shardlm(binary, model_dir, plain, workdir, name + "-flags",
                       ["--repetition-penalty", "1.2", "--frequency-penalty", "0.3", "--presence-penalty", "0.4"])
    ok &= compare_rows(name + " (command line)", model, plain, rows, lambda r: flag_case)

    # transformers' own repetition penalty: its generate gives what the loop gives.
    for j, p in enumerate(prompts):
        prompt, _ = rows_of_prompt(binary, model_dir, p, workdir, name, j)
        with torch.no_grad():
            # The mask given: generate would otherwise mask every prompt token equal to pad_token_id.
            ids = torch.tensor([prompt])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, repetition_penalty=1.3,
                                 max_new_tokens=MAX_TOKENS, pad_token_id=0)
        loop, _ = reference_steps(model, prompt, MAX_TOKENS, 1.3, 0.0, 0.0)
        got = [int(x) for x in gen[0, len(prompt):]]
        if got != loop:
            print(f"  {name} prompt {j}: transformers' generate {got[:12]} vs the reference loop {loop[:12]}")
            ok = False
    print(f"{name}: transformers' generate with repetition_penalty 1.3 checked on {len(prompts)} prompts")
    return ok


def rows_of_prompt(binary, model_dir, p, workdir, name, j):
    """The prompt's ids as shardlm tokenized them (one greedy token, no penalty)."""
    rows = run_shardlm(binary, model_dir, [dict(p, id="t", max_tokens=1)], workdir, f"{name}-ids{j}")
    return rows["t"]


def main():
    return hf_compare.check_stories_and_tiny_llama("penalties_hf_compare", check_model, STORY_PROMPTS, 5, (3, 9, 24))


if __name__ == "__main__":
    sys.exit(main())
