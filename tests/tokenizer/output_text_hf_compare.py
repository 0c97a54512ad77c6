#!/usr/bin/env python3
"""Compares `shardlm run`'s output_text with the text vLLM's incremental detokenizer gives for the
same prompt and output ids, built here on Hugging Face `tokenizers`' DecodeStream as vLLM's
FastIncrementalDetokenizer builds it: the stream is first fed the prompt's tail (the whole prompt up
to 4 tokens, else the shortest suffix of 4 to 23 tokens that decodes without U+FFFD), then each
output id; a piece is appended when the stream gives one, nothing is flushed at the end, the stop
token's text stays out and a stop string cuts the text where it starts.

So the SentencePiece space before a continuation's first word is kept ("Once upon a time," gives
" there", where decode(output) gives "there"), and a character the output leaves unfinished stays
out instead of ending in U+FFFD.

Models:
- stories260K (SentencePiece with byte fallback): text prompts, greedy and sampled, stop strings.
- a random tiny Qwen2 with the shared Qwen2 byte-level tokenizer: sampled at temperature 1 from
  random weights, its outputs are random token runs across the 151k vocabulary, many of them pieces
  of CJK characters and emoji cut at max_tokens.

One difference is by design: where the output ends in bytes no later token can complete (a lone
continuation byte, or U+FFFD the model wrote as a token), shardlm writes U+FFFD at once and
DecodeStream holds it back for good; such rows must differ in exactly those trailing U+FFFD.

Exit code 77 (CTest: skipped) without `tokenizers` or `h5py`, or without ../shared.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import h5py
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream
except ImportError as e:  # pragma: no cover
    print(f"output_text_hf_compare: skipped, {e.name} is not installed (pip install tokenizers h5py)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPLACEMENT = "\ufffd"


def context(tok, prompt):
    """vLLM's choice of the prompt tail the stream is primed with."""
    if len(prompt) > 4:
        for n in range(4, min(len(prompt), 23) + 1):
            suffix = prompt[-n:]
            if REPLACEMENT not in tok.decode(suffix):
                return suffix
    return prompt


def reference_text(tok, prompt, output, stops, finish):
    stream = DecodeStream(skip_special_tokens=True)
    for t in context(tok, prompt):
        stream.step(tok, t)
    text = ""
    for i, t in enumerate(output):
        before = text
        piece = stream.step(tok, t)
        if piece:
            text += piece
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return text[:min(hits)]
        if i == len(output) - 1 and finish == "stop":
            return before  # a stop token (no stop string matched): its text stays out
    return text


def run(shardlm, model, requests, workdir, name):
    prompts = os.path.join(workdir, name + ".jsonl")
    with open(prompts, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    out = os.path.join(workdir, name + ".h5")
    subprocess.run([shardlm, "run", "--model", model, "--prompts", prompts, "--out", out, "-q"], check=True,
                   capture_output=True)
    rows = []
    with h5py.File(out, "r") as h:
        req = h["requests"]
        for i in range(len(req["id"])):
            rows.append(dict(id=req["id"][i].decode(), prompt=[int(x) for x in req["prompt_tokens"][i]],
                             output=[int(x) for x in req["output_tokens"][i]],
                             text=req["output_text"][i].decode("utf-8"),
                             finish=req["finish_reason"][i].decode(), error=req["error"][i].decode()))
    return rows


def compare(name, tok, requests, rows):
    by_id = {str(r["id"]): r for r in requests}
    ok, same, by_design = True, 0, 0
    for row in rows:
        if row["error"]:
            print(f"  {name} {row['id']}: error row: {row['error']}")
            ok = False
            continue
        stops = by_id[row["id"]].get("stop", [])
        want = reference_text(tok, row["prompt"], row["output"], stops, row["finish"])
        if row["text"] == want:
            same += 1
        elif row["text"].startswith(want) and set(row["text"][len(want):]) == {REPLACEMENT}:
            by_design += 1
        else:
            ok = False
            print(f"  {name} {row['id']}: prompt {row['prompt'][-8:]} output {row['output']} finish {row['finish']}\n"
                  f"    shardlm {row['text']!r}\n    vLLM    {want!r}")
    leading = sum(1 for row in rows if row["text"].startswith(" "))
    print(f"{name:28s} {len(rows)} rows: {same} equal, {by_design} differ only by trailing U+FFFD (by design), "
          f"{leading} start with a space  {'ok' if ok else 'FAIL'}")
    return ok and len(rows) == len(requests)


STORIES_PROMPTS = ["Once upon a time,", "Once upon a time", "The cat sat", "Lily wanted to play with her",
                   "One day, a little boy named Tim went to the park. He saw", "Hello"]


def stories(shardlm, shared, workdir):
    model = os.path.join(shared, "models", "stories260K")
    if not os.path.isdir(model):
        print(f"stories260K: skipped, {model} is absent")
        return None
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    requests = []
    for i, p in enumerate(STORIES_PROMPTS):
        requests.append({"id": f"greedy{i}", "prompt": p, "max_tokens": 3 + 5 * i})
        requests.append({"id": f"sampled{i}", "prompt": p, "max_tokens": 40, "temperature": 1.0, "seed": i})
        requests.append({"id": f"stop{i}", "prompt": p, "max_tokens": 60, "stop": [" there", " the", "."]})
        # Stop strings that span tokens or start inside one.
        requests.append({"id": f"mid{i}", "prompt": p, "max_tokens": 60, "stop": ["ere w", "ttle g", "ay", "ed t"]})
    return compare("stories260K", tok, requests, run(shardlm, model, requests, workdir, "stories"))


QWEN_PROMPTS = ["你好，世界", "Emoji: 🙂🎉 and more", "Ünïcödé façade", "def f(x):\n    return", "数学", "a"]


def qwen2(shardlm, shared, workdir):
    tokdir = os.path.join(shared, "tokenizers", "qwen2")
    if not os.path.isfile(os.path.join(tokdir, "tokenizer.json")):
        print(f"qwen2: skipped, {tokdir} is absent")
        return None
    tok = Tokenizer.from_file(os.path.join(tokdir, "tokenizer.json"))
    with open(os.path.join(ROOT, "inputs", "models", "tiny-qwen2.json")) as f:
        config = json.load(f)
    config.update(vocab_size=tok.get_vocab_size(), bos_token_id=None, eos_token_id=None, hidden_size=32,
                  intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    cfg = os.path.join(workdir, "qwen2-config.json")
    with open(cfg, "w") as f:
        json.dump(config, f)
    model = os.path.join(workdir, "qwen2-model")
    subprocess.run([shardlm, "make-model", "--config", cfg, "--out", model, "--dtype", "bf16", "--seed", "5"],
                   check=True, capture_output=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokdir, name), os.path.join(model, name))
    requests = []
    for i in range(120):
        requests.append({"id": f"r{i}", "prompt": QWEN_PROMPTS[i % len(QWEN_PROMPTS)], "max_tokens": 1 + i % 12,
                         "temperature": 1.0, "seed": 1000 + i, "ignore_eos": True})
    return compare("qwen2 (random weights)", tok, requests, run(shardlm, model, requests, workdir, "qwen2"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(ROOT), "shared"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [stories(args.shardlm, args.shared, tmp), qwen2(args.shardlm, args.shared, tmp)]
    if all(r is None for r in results):
        print("output_text_hf_compare: skipped, ../shared is absent")
        return 77
    ok = all(r is not False for r in results)
    print("output_text_hf_compare:", "every output_text matches" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
