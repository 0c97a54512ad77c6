#!/usr/bin/env python3
"""Splits a prompt file into N shards of consecutive lines for a Slurm job array (slurm/array.sh).

    python3 slurm/split_prompts.py PROMPTS OUTDIR N [FORMAT]   # writes OUTDIR/shard-000.jsonl ... and prints N

Line numbers stay those of the whole file. shardlm records each request's line number
(/requests/line), and a line without an "id" (every line of a plain-text file) gets its line number
as id, from which its sampling seed is derived when it has none. So shard k holds its range of
lines at their original positions: the lines before the range are written as empty lines, which
the JSONL reader skips but counts (about one byte per skipped line), and the file ends after the
range. Each shard then gives exactly the ids, lines and tokens that a run over the whole file gives
for those lines, and `shardlm merge` of the shards' outputs equals one run over the whole file.

JSONL and OpenAI batch JSONL lines are copied byte for byte. A plain-text prompt file is converted:
line n becomes {"id": "n", "prompt": <the line>}, the id and prompt the text reader would give it.
FORMAT is the run's --format: jsonl or openai (copied), text (converted), or auto (the default:
text unless the name ends in .jsonl or .json, as shardlm decides). The shards are JSONL either way:
run them with --format jsonl (openai for OpenAI batch lines). Shards never outnumber the file's lines; the count written is printed
on stdout (the array size to submit). Memory stays flat whatever the file size.
"""
import json
import os
import sys


def count_lines(path):
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while True:
            buf = f.read(1 << 20)
            if not buf:
                break
            n += buf.count(b"\n")
            last = buf[-1:]
    return n + (last != b"\n")


def main(argv):
    if len(argv) not in (4, 5):
        sys.stderr.write(__doc__)
        return 2
    src, outdir, want = argv[1], argv[2], int(argv[3])
    fmt = argv[4] if len(argv) == 5 else "auto"
    if fmt not in ("auto", "jsonl", "text", "openai"):
        sys.exit(f"split_prompts: FORMAT must be auto, jsonl, text or openai (got {fmt!r})")
    if want < 1:
        sys.exit(f"split_prompts: N must be >= 1 (got {want})")
    lines = count_lines(src)
    if lines == 0:
        sys.exit(f"split_prompts: {src} is empty")
    shards = min(want, lines)
    if fmt == "auto":
        text = not src.lower().endswith((".jsonl", ".json"))  # as the reader decides, case aside
    else:
        text = fmt == "text"
    os.makedirs(outdir, exist_ok=True)
    # Shard k takes lines [bounds[k], bounds[k+1]) (1-based): balanced, consecutive.
    bounds = [1 + k * lines // shards for k in range(shards + 1)]
    with open(src, "rb") as f:
        line_no = 0
        for k in range(shards):
            path = os.path.join(outdir, f"shard-{k:03d}.jsonl")
            with open(path + ".tmp", "wb") as out:
                out.write(b"\n" * (bounds[k] - 1))
                while line_no + 1 < bounds[k + 1]:
                    raw = f.readline()
                    line_no += 1
                    if text:
                        body = raw.rstrip(b"\n")
                        if body.endswith(b"\r"):
                            body = body[:-1]
                        if line_no == 1 and body.startswith(b"\xef\xbb\xbf"):
                            body = body[3:]
                        # Bytes that are not UTF-8 go through unchanged (surrogateescape), so that
                        # shardlm reports the line as not UTF-8, as the text reader would.
                        prompt = body.decode("utf-8", errors="surrogateescape")
                        raw = json.dumps({"id": str(line_no), "prompt": prompt}, ensure_ascii=False)
                        raw = raw.encode("utf-8", errors="surrogateescape")
                        raw += b"\n"
                    elif not raw.endswith(b"\n"):
                        raw += b"\n"
                    out.write(raw)
            os.replace(path + ".tmp", path)
            sys.stderr.write(f"[split] {path}: lines {bounds[k]}-{bounds[k + 1] - 1}\n")
    print(shards)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
