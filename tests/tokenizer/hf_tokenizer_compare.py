#!/usr/bin/env python3
"""Compares `shardlm tokenize` with Hugging Face `tokenizers` on a tokenizer.json, both ways.

Encoding: hand-written edge cases (contractions in any case, every kind of Unicode space, U+180E,
line breaks, combining marks, emoji, added tokens mid-word, invalid-looking input) and seeded random
strings mixing scripts, spaces, digits and punctuation; each is encoded by `tokenizers` without
special tokens added (as shardlm's encode) and must give the same ids. The cases travel to shardlm
joined by one of the tokenizer's special added tokens, which both sides match before anything else,
so each case's ids are those between separators.

Decoding: seeded random id sequences (byte-level pieces of characters split between tokens, special
tokens, runs of any token) decode with skip_special_tokens and must give the same text. With a
ByteFallback decoder, lists whose bytes are not valid UTF-8 are left out: there the two replace
invalid bytes differently, by design (see main()).

Characters are drawn from blocks whose letters, marks and numbers were all assigned before Unicode
14 (the PCRE2 of Debian 12 has Unicode 14 tables; `tokenizers`' regex engine has later ones, so a
letter added since reads as unassigned to one and as a letter to the other).

Exit code 77 (CTest: skipped) when `tokenizers` or the tokenizer file is absent.
"""
import argparse
import json
import os
import random
import sys

import shardlm_tokenize

try:
    from tokenizers import Tokenizer
except ImportError as e:  # pragma: no cover
    print(f"hf_tokenizer_compare: skipped, {e.name} is not installed (pip install tokenizers)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FIXED_CASES = [
    "Hello world", " Hello world", "  two leading", "trailing  ", "\n\n\nlines\r\n\r\nCRLF\r\n",
    "I'm sure they'll say it's fine, but we'd rather you'VE checked. DON'T SHOUT'S",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve 'M 'Ll 'D",
    "1234567 and 3.14159, 1,000,000; 2024-06-30T12:00:00Z; 0x7fff",
    "nbsp\u00a0here, ideographic\u3000space, thin\u2009space, zwsp\u200bhere, ogham\u1680x",
    "nel\u0085line ls\u2028ps\u2029end \u000bvt \u000cff \u001cfs \u001fus",
    "mvs\u180ehere \u180e's x \u180e! a\u180e\u180e b \u3000\u180e x",
    "e\u0301 combining: a\u0308o\u0308u\u0308, caf\u0065\u0301 vs caf\u00e9",
    "你好，世界！ 我们在学习分词器。「引用」（括号）",
    "Привет, мир! Γειά σου Κόσμε. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก",
    "emoji 🙂👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 keycap 1️⃣",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "<div class=\"a\">text</div> && || != == <= >= -> => ::",
    "\ufffd replacement \ufffd\ufffd and U+FFFF-adjacent \uffef",
    "İstanbul ǅemal Ångström ß ẞ ﬁ ligature",
    "A" * 300 + " " + "中" * 300 + " " + "1" * 50,
    " " * 40 + "x" + "\t" * 10 + "y",
    "",
]

# (first, last, weight) of code point blocks assigned in full before Unicode 14.
RANGES = [
    (0x20, 0x7E, 30), (0x09, 0x0D, 4), (0x30, 0x39, 6), (0xA0, 0xFF, 3), (0x100, 0x24F, 2), (0x250, 0x2AF, 1),
    (0x300, 0x36F, 2), (0x370, 0x3FF, 2), (0x400, 0x4FF, 3), (0x5D0, 0x5EA, 1), (0x620, 0x64A, 2),
    (0x900, 0x939, 1), (0xE01, 0xE3A, 1), (0x1100, 0x11FF, 1), (0x2000, 0x206F, 2), (0x2150, 0x218B, 1),
    (0x2460, 0x24FF, 1), (0x3000, 0x303F, 3), (0x3041, 0x3096, 2), (0x30A0, 0x30FF, 2), (0x4E00, 0x9FA5, 8),
    (0xAC00, 0xD7A3, 2), (0xFF01, 0xFF5E, 2), (0x1F600, 0x1F64F, 2), (0x1F300, 0x1F5FF, 1),
]
SNIPPETS = [" ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "'re", "I'm", "they'll", "123", "1234567", "\u200d",
            "\ufe0f", "\u3000", "\u00a0", "\u180e", " the", "The", "ABC", "abc", "!!", "...", "\u0301"]


def random_cases(count, rng, specials):
    weights = [w for _, _, w in RANGES]
    cases = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 60)):
            r = rng.random()
            if r < 0.03 and specials:
                parts.append(rng.choice(specials))
            elif r < 0.25:
                parts.append(rng.choice(SNIPPETS))
            else:
                lo, hi, _ = rng.choices(RANGES, weights)[0]
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8))))
        cases.append("".join(parts))
    return cases


def random_id_lists(count, rng, vocab_size, specials):
    lists = []
    for _ in range(count):
        ids = []
        for _ in range(rng.randint(1, 40)):
            r = rng.random()
            if r < 0.05 and specials:
                ids.append(rng.choice(specials))
            elif r < 0.15 and ids:
                ids.append(ids[-1])  # runs of one token
            else:
                ids.append(rng.randrange(vocab_size))
        lists.append(ids)
    return lists


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    ap.add_argument("--tokenizer", required=True, help="directory holding tokenizer.json")
    ap.add_argument("--random", type=int, default=400, help="random texts to encode")
    ap.add_argument("--decode", type=int, default=60, help="random id lists to decode")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    path = os.path.join(args.tokenizer, "tokenizer.json")
    if not os.path.exists(path):
        print(f"hf_tokenizer_compare: skipped, {path} is absent")
        sys.exit(77)
    hf = Tokenizer.from_file(path)
    added = hf.get_added_tokens_decoder()
    specials = sorted(t.content for t in added.values() if t.special)
    special_ids = sorted(i for i, t in added.items() if t.special)
    if not specials:
        print("hf_tokenizer_compare: skipped, the tokenizer has no special token to join the cases")
        sys.exit(77)
    sep_text = specials[0]
    sep_id = hf.token_to_id(sep_text)
    rng = random.Random(args.seed)
    cases = [c for c in FIXED_CASES + random_cases(args.random, rng, specials[1:]) if sep_text not in c]
    cases = [c.replace("\0", " ") for c in cases]  # NUL cannot travel in argv

    bad = 0
    ref = [hf.encode(c, add_special_tokens=False).ids for c in cases]
    ours = shardlm_tokenize.encode_many(args.shardlm, args.tokenizer, cases, sep_text, sep_id)
    for text, r, o in zip(cases, ref, ours):
        if r != o:
            bad += 1
            if bad <= 10:
                print(f"ENCODE MISMATCH on {text!r}:\n  tokenizers {r}\n  shardlm    {o}")

    vocab = hf.get_vocab_size(with_added_tokens=True)
    # A ByteFallback decoder turns every byte token of a run that is not valid UTF-8 as a whole into
    # U+FFFD, ASCII bytes included; shardlm replaces each maximal ill-formed subsequence, so that
    # decoding stays prefix-stable for streaming (tokenizer/decoder.h). Such lists are not compared.
    byte_fallback = "ByteFallback" in json.dumps(json.load(open(path, encoding="utf-8")).get("decoder"))
    lists, skipped = [], 0
    while len(lists) < args.decode and skipped < 50 * args.decode:
        ids = random_id_lists(1, rng, vocab, special_ids)[0]
        if byte_fallback and "\ufffd" in hf.decode(ids, skip_special_tokens=True):
            skipped += 1
            continue
        lists.append(ids)
    decoded_bad = 0
    for ids in lists:
        want = hf.decode(ids, skip_special_tokens=True)
        got = shardlm_tokenize.run(args.shardlm, args.tokenizer, "--decode", " ".join(map(str, ids)))
        got = got[:-1] if got.endswith("\n") else got
        if want != got:
            decoded_bad += 1
            if decoded_bad <= 10:
                print(f"DECODE MISMATCH on {ids}:\n  tokenizers {want!r}\n  shardlm    {got!r}")

    import tokenizers
    print(f"hf_tokenizer_compare: tokenizers {tokenizers.__version__}, {args.tokenizer}: {len(cases)} texts "
          f"({sum(map(len, ref))} tokens), {bad} encode mismatches; {len(lists)} id lists, "
          f"{decoded_bad} decode mismatches" + (f" ({skipped} byte-fallback lists with U+FFFD not compared)"
                                                if skipped else ""))
    return 1 if bad or decoded_bad else 0


if __name__ == "__main__":
    sys.exit(main())
