#!/usr/bin/env python3
"""What --ep-wire bf16 costs in accuracy, measured against Hugging Face transformers.

For make-model's tiny MoE configs (Mixtral, Qwen2-MoE with its gated shared expert, DeepSeek-V3
with MLA and group-limited sigmoid routing) in bf16 weights, `shardlm run` generates greedily from
random prompts, once on one rank and once over expert parallelism (mpirun -np 2, --dp 2 --ep 2)
with the rows on a bf16 wire. transformers then scores the same sequences teacher-forced, in fp32
(eager attention) and with the whole model in bf16 (what a bf16 deployment computes), and each
generated token's logprob is compared:

  single rank   shardlm, nothing rounded        vs transformers fp32: within hf_compare's tolerance
  bf16 wire     shardlm, expert rows in bf16    vs transformers fp32: the wire's own error
  bf16 model    transformers in bf16            vs transformers fp32: a bf16 model's error

Each shardlm run is scored on the tokens it generated itself (random prompts leave near-ties that
any rounding may tip). Passes when the single rank agrees with transformers (hf_compare.py's
tolerance on logprobs) and the bf16 wire's largest logprob error is at most the bf16 model's (the
wire rounds only the experts' inputs and outputs, the bf16 model every activation). The KV cache is
fp32 in both runs, so that the wire is the only rounding. Prints the figures.

Exit code 77 (CTest: skipped) when torch or transformers is not installed.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import h5py
    import numpy as np
    import torch
    import transformers
except ImportError as e:  # pragma: no cover
    print(f"ep_wire_hf_compare: skipped, {e.name} is not installed (pip install torch transformers h5py)")
    sys.exit(77)

import hf_compare  # noqa: E402  (model making, loading, and the tolerance)

CONFIGS = ["tiny-mixtral", "tiny-qwen2-moe", "tiny-deepseek-v3"]
PROMPTS, PROMPT_LEN, NEW_TOKENS = 4, 24, 24


def run(binary, model, prompts, out, extra, mpirun=None):
    cmd = ([] if mpirun is None else [mpirun, "--oversubscribe", "-np", "2"]) + [binary, "run", "--model", model, "--prompts", prompts, "--out", out,
                                            "--threads", "1", "-q", "--ignore-eos", "--kv-dtype", "fp32"] + extra
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    with h5py.File(out) as f:
        r = f["requests"]
        ids = [x.decode() if isinstance(x, bytes) else x for x in r["id"][:]]
        return {i: (list(p), list(o), np.array(lp, dtype=np.float64))
                for i, p, o, lp in zip(ids, r["prompt_tokens"][:], r["output_tokens"][:], r["token_logprobs"][:])}


def hf_logprobs(model, prompt, output):
    """The logprob of each generated token, teacher-forced, in the model's own dtype."""
    ids = torch.tensor([prompt + output[:-1]], dtype=torch.long)
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)[len(prompt) - 1:]
    return lp.gather(1, torch.tensor(output).unsqueeze(1)).squeeze(1).double().numpy()


def load(model_dir, dtype):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    return model.eval()


def check(binary, mpirun, cfg, tmp, rng):
    d = os.path.join(tmp, cfg)
    hf_compare.make_model(binary, cfg, d, "bf16", rng, 1)
    with open(os.path.join(d, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompts = os.path.join(tmp, cfg + ".jsonl")
    with open(prompts, "w") as f:
        for i in range(PROMPTS):
            ids = [int(x) for x in rng.integers(3, vocab, size=PROMPT_LEN)]
            f.write(json.dumps({"id": f"p{i}", "prompt_token_ids": ids, "max_tokens": NEW_TOKENS}) + "\n")
    single = run(binary, d, prompts, os.path.join(tmp, cfg + "-one.h5"), [])
    wire = run(binary, d, prompts, os.path.join(tmp, cfg + "-wire.h5"), ["--dp", "2", "--ep", "2", "--ep-wire", "bf16"],
               mpirun)
    fp32, bf16 = load(d, torch.float32), load(d, torch.bfloat16)
    err = {"single rank": 0.0, "bf16 wire": 0.0, "bf16 model": 0.0}
    mean = {k: [] for k in err}
    same = 0
    for rid, (prompt, output, lp_one) in single.items():
        _, out_wire, lp_wire = wire[rid]
        same += out_wire == output
        # Each run against transformers on the sequence it generated itself (a near-tie between
        # two tokens may go either way under any rounding; the logprobs are what is compared).
        ref = hf_logprobs(fp32, prompt, output)
        for k, v, r in (("single rank", lp_one, ref), ("bf16 wire", lp_wire, hf_logprobs(fp32, prompt, out_wire)),
                        ("bf16 model", hf_logprobs(bf16, prompt, output), ref)):
            e = np.abs(v - r)
            err[k] = max(err[k], float(e.max()))
            mean[k].append(float(e.mean()))
    tol = hf_compare.ATOL + hf_compare.RTOL * max(abs(float(v[2].min())) for v in single.values())
    ok = err["single rank"] <= tol and err["bf16 wire"] <= err["bf16 model"]
    print(f"{cfg:20s} max|dlogprob| vs transformers fp32: single rank {err['single rank']:.2e} (tol {tol:.1e}), "
          f"bf16 wire {err['bf16 wire']:.2e} (mean {np.mean(mean['bf16 wire']):.2e}), "
          f"bf16 model {err['bf16 model']:.2e} (mean {np.mean(mean['bf16 model']):.2e}); the wire kept the tokens of "
          f"{same}/{len(single)} requests  {'ok' if ok else 'FAIL'}")
    return ok


def main():
    ap = hf_compare.arg_parser()
    ap.add_argument("--mpirun", default="mpirun")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    rng = np.random.default_rng(1)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in CONFIGS:
            ok &= check(args.shardlm, args.mpirun, cfg, tmp, rng)
    print("ep_wire_hf_compare:", "ok" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
