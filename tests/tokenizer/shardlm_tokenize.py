"""`shardlm tokenize` driven from the peer comparisons (hf_tokenizer_compare.py,
kimi_tiktoken_compare.py): many texts encoded in as few calls as the argv limit allows."""
import subprocess

MAX_ARG_BYTES = 100_000  # one argv string must stay under Linux's 128 KiB limit


def run(binary, tok_dir, *args):
    """stdout of `shardlm tokenize --model tok_dir ARGS...`, decoded as UTF-8."""
    res = subprocess.run([binary, "tokenize", "--model", tok_dir, *args], check=True, capture_output=True)
    return res.stdout.decode("utf-8")


def encode_many(binary, tok_dir, texts, sep_text, sep_id):
    """Each text's ids: the texts go joined by sep_text, a special token both sides match before
    anything else (so it never merges with a neighbour), and the ids are cut at sep_id."""
    out, batch = [], []

    def flush():
        if not batch:
            return
        ids = [int(x) for x in run(binary, tok_dir, "--text=" + sep_text.join(batch)).split()]
        per, cur = [], []
        for i in ids:
            if i == sep_id:
                per.append(cur)
                cur = []
            else:
                cur.append(i)
        per.append(cur)
        if len(per) != len(batch):
            raise RuntimeError(f"expected {len(batch)} cases back, got {len(per)}")
        out.extend(per)
        batch.clear()

    size = 0
    for t in texts:
        n = len(t.encode()) + len(sep_text.encode())
        if size + n > MAX_ARG_BYTES:
            flush()
            size = 0
        batch.append(t)
        size += n
    flush()
    return out
