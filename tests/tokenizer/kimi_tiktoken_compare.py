#!/usr/bin/env python3
"""Compares `shardlm tokenize` on Kimi K2's tiktoken.model with the tiktoken package itself.

The reference is built the way Kimi's TikTokenTokenizer builds it: the ranks of
../shared/tokenizers/kimi-k2/tiktoken.model, the split pattern below (Python `regex` / Rust syntax,
with class intersection), and 256 specials from id len(ranks) on, named by tokenizer_config.json's
added_tokens_decoder or "<|reserved_token_ID|>". Encoding cuts out the specials first (as
transformers does with added tokens), then feeds tiktoken each plain segment in the chunks
TikTokenTokenizer.encode makes (400,000 characters; runs of at most 25,000 whitespace or
non-whitespace characters), allowing every special.

Cases: hand-written multilingual and edge-case texts plus seeded random strings mixing scripts,
whitespace, digits, punctuation, combining marks and emoji. They are encoded in a few shardlm calls:
cases are joined by a reserved special token, which both sides match before splitting, so each
case's ids are the ids between separators.

--write-golden PATH also writes the cases (JSON lines {"text", "ids"}; the fixed ones up to 2,000
characters and the first random ones) for tests/tokenizer's C++ test, which checks them without
tiktoken. Exit code 77 (CTest: skipped) when tiktoken or the
shared tokenizer files are absent.
"""
import argparse
import base64
import json
import os
import random
import re
import sys

import shardlm_tokenize

try:
    import tiktoken
except ImportError as e:  # pragma: no cover
    print(f"kimi_tiktoken_compare: skipped, {e.name} is not installed (pip install tiktoken)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_RESERVED = 256
SEPARATOR_ID_OFFSET = 200  # a reserved (unnamed) special joins the cases
MAX_CHUNK_CHARS = 400_000  # TikTokenTokenizer's TIKTOKEN_MAX_ENCODE_CHARS
MAX_RUN_CHARS = 25_000     # TikTokenTokenizer's MAX_NO_WHITESPACES_CHARS

NOT_HAN_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
NOT_HAN_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?" + NOT_HAN_UPPER + "*" + NOT_HAN_LOWER + "+" + CONTRACTION,
    r"[^\r\n\p{L}\p{N}]?" + NOT_HAN_UPPER + "+" + NOT_HAN_LOWER + "*" + CONTRACTION,
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

FIXED_CASES = [
    "Hello, world! 你好，世界！",
    "<|im_middle|>Hello, world! 你好，世界！<|im_end|>",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, but we'd rather you'VE checked. DON'T SHOUT'S",
    "1234567 and 3.14159, 1,000,000; 2024-06-30T12:00:00Z; 0x7fff",
    "  leading spaces, tabs\tand\nnewlines  \n\n\n   trailing   ",
    "line one\r\nline two\r\n\r\n  indented\n\t\ttabbed\n",
    "你好世界。今天天气很好、我们去公园吧！「引用」（括号）《书名》",
    "日本語のテキストです。カタカナとひらがな、漢字が混ざっています。ー〜",
    "한국어 텍스트입니다. 안녕하세요!",
    "مرحبا بالعالم، هذا نص عربي.",
    "Привет, мир! Это русский текст с ЗАГЛАВНЫМИ буквами.",
    "Γειά σου Κόσμε. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก",
    "emoji 🙂👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 keycap 1️⃣",
    "Café naïve résumé Ångström Ǆemal ǅemal ʰmodifier",
    "e\u0301 combining: a\u0308o\u0308u\u0308 and 漢\u0301字",
    "〇一二三 々 〆 Ⅻ ½ ² ³ ①②③",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "<div class=\"a\">text</div> && || != == <= >= -> => ::",
    "URL https://example.com/path?q=1&r=2#frag email a.b@c.de",
    "nbsp\u00a0here, ideographic\u3000space, thin\u2009space, zwsp\u200bhere, mvs\u180ehere",
    "nel\u0085line ls\u2028ps\u2029end \u000bvt \u000cff",
    # U+180E is not White_Space (PCRE2's \s with UCP has it).
    "\u180e_b", " \u180e\u1821", "x \u180e!", "\u180e's", "a \u180e\u180e  b",
    "special in the mid<|im_end|>dle of a word and [BOS][EOS] and <|reserved_token_163700|>",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
    "almost <|im_end| special <|im_end|x <|reserved_token_1|>",
    "'s 't 're alone's 'S 'T",
    "    \n    ",
    "!!!???...---***",
    "A" * 300 + " " + "中" * 300 + " " + "1" * 50,
    "",
    # Runs longer than MAX_RUN_CHARS are cut (here inside a word).
    "abcde1," * 3900,
    " " * 26000 + "x\x1c" * 10,
    "中文字" * 9000 + "\n",
]

RANGES = [
    (0x20, 0x7E, 30), (0x09, 0x0D, 4), (0x30, 0x39, 6), (0xA0, 0xFF, 3), (0x100, 0x24F, 2), (0x250, 0x2FF, 1),
    (0x300, 0x36F, 2), (0x370, 0x3FF, 2), (0x400, 0x4FF, 3), (0x590, 0x5FF, 1), (0x600, 0x6FF, 2),
    (0x900, 0x97F, 1), (0xE00, 0xE7F, 1), (0x1100, 0x11FF, 1), (0x2000, 0x206F, 2), (0x2150, 0x218F, 1),
    (0x2460, 0x24FF, 1), (0x2E80, 0x2FDF, 1), (0x3000, 0x303F, 3), (0x3040, 0x30FF, 3), (0x3190, 0x31FF, 1),
    (0x3200, 0x33FF, 1), (0x3400, 0x4DBF, 1), (0x4E00, 0x9FFF, 8), (0xAC00, 0xD7A3, 2), (0xF900, 0xFAFF, 1),
    (0xFE00, 0xFE0F, 1), (0xFF00, 0xFFEF, 2), (0x1F300, 0x1FAFF, 3), (0x20000, 0x2A6DF, 1),
]
SNIPPETS = [" ", "  ", "\n", "\r\n", "'s", "'LL", "'re", "I'm", "they'll", "123", "1234567", "\u200d", "\ufe0f",
            "\u3000", "\u00a0", "<|im_end|>", "[EOS]", "<|reserved_token_163650|>", " the", "The", "ABC", "abc"]


def random_cases(count, seed=1234):
    rng = random.Random(seed)
    weights = [w for _, _, w in RANGES]
    cases = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 60)):
            if rng.random() < 0.2:
                parts.append(rng.choice(SNIPPETS))
                continue
            lo, hi, _ = rng.choices(RANGES, weights)[0]
            parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8))))
        cases.append("".join(parts))
    return cases


def split_runs(s, max_run):
    """Cuts s before any character that makes a run of (non-)whitespace longer than max_run."""
    run, run_space, start = 0, s[:1].isspace(), 0
    for i, ch in enumerate(s):
        space = ch.isspace()
        if space != run_space:
            run, run_space = 1, space
        else:
            run += 1
            if run > max_run:
                yield s[start:i]
                start, run = i, 1
    yield s[start:]


class Reference:
    """Kimi K2 encoding: specials cut out first, then tiktoken on each chunk of each plain segment."""

    def __init__(self, enc, specials):
        self.enc = enc
        names = sorted(specials, key=len, reverse=True)
        self.specials = specials
        self.special_re = re.compile("(" + "|".join(map(re.escape, names)) + ")")

    def encode(self, text):
        ids = []
        for k, part in enumerate(self.special_re.split(text)):
            if k % 2:
                ids.append(self.specials[part])
                continue
            for i in range(0, len(part), MAX_CHUNK_CHARS):
                for chunk in split_runs(part[i:i + MAX_CHUNK_CHARS], MAX_RUN_CHARS):
                    ids.extend(self.enc.encode(chunk, allowed_special="all"))
        return ids


def load_reference(tok_dir):
    ranks = {}
    with open(os.path.join(tok_dir, "tiktoken.model"), "rb") as fh:
        for line in fh.read().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    nb = len(ranks)
    with open(os.path.join(tok_dir, "tokenizer_config.json")) as fh:
        named = {int(k): v["content"] for k, v in json.load(fh).get("added_tokens_decoder", {}).items()}
    specials = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(nb, nb + N_RESERVED)}
    enc = tiktoken.Encoding(name="kimi-k2", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    return Reference(enc, specials), nb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(ROOT), "shared"))
    ap.add_argument("--random", type=int, default=400, help="number of random cases")
    ap.add_argument("--write-golden", metavar="PATH", help="also write the cases as JSON lines")
    ap.add_argument("--golden-random", type=int, default=60, help="random cases kept in the golden file")
    args = ap.parse_args()
    tok_dir = os.path.join(args.shared, "tokenizers", "kimi-k2")
    if not os.path.exists(os.path.join(tok_dir, "tiktoken.model")):
        print(f"kimi_tiktoken_compare: skipped, {tok_dir}/tiktoken.model is absent")
        sys.exit(77)
    ref_tok, nb = load_reference(tok_dir)
    sep_id = nb + SEPARATOR_ID_OFFSET
    sep_text = ref_tok.enc.decode([sep_id])
    cases = FIXED_CASES + random_cases(args.random)
    # NUL cannot travel in argv; the separator must not occur inside a case.
    cases = [c.replace("\0", " ") for c in cases if sep_text not in c]
    ref = [ref_tok.encode(c) for c in cases]
    ours = shardlm_tokenize.encode_many(args.shardlm, tok_dir, cases, sep_text, sep_id)
    bad = 0
    for text, r, o in zip(cases, ref, ours):
        if r != o:
            bad += 1
            if bad <= 10:
                print(f"MISMATCH on {text!r}:\n  tiktoken {r}\n  shardlm  {o}")
    print(f"kimi_tiktoken_compare: tiktoken {tiktoken.__version__}, {len(cases)} cases, "
          f"{sum(map(len, ref))} tokens, {bad} mismatches")
    if args.write_golden:
        keep = [(t, ids) for t, ids in zip(cases[:len(FIXED_CASES) + args.golden_random], ref) if len(t) <= 2000]
        with open(args.write_golden, "w", encoding="utf-8") as fh:
            for text, ids in keep:
                fh.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")
        print(f"wrote {len(keep)} cases to {args.write_golden}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
