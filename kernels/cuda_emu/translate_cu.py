#!/usr/bin/env python3
"""Turns a CUDA source of kernels/cuda into host C++ for the emulation (see cuda_runtime.h).

Two constructs have no C++ spelling, so they are rewritten; everything else is left to the
macros and functions of the emulated cuda_runtime.h:
  kernel<<<grid, block[, shared[, stream]]>>>(args)
      -> (::shardlm_emu::Launch(fn_key(kernel), "kernel", grid, block[, ...]) | [=](auto&... a) { kernel(a...); })(args)
  extern __shared__ T name[];
      -> T* name = static_cast<T*>(::shardlm_emu::dynamic_shared());
A static `__shared__ T name[...];` stays (the macro makes it a function static) and is followed
by ::shardlm_emu::fresh_shared(&name, sizeof(name)), which fills it with NaN bytes once per block.

Usage: translate_cu.py IN.cu OUT.cpp (or IN.cuh OUT.cuh: a device header)
"""
import os
import re
import sys

# A kernel name, maybe qualified and with template arguments, then <<<config>>>.
LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:\s*<[^<>;()]*(?:<[^<>;()]*>[^<>;()]*)*>)?)\s*<<<(.*?)>>>", re.S)
DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w:\s]+?)\s+(\w+)\s*\[\s*\]\s*;")
# A static shared declaration: __shared__ [__align__(n)] T name[dims]...;
STATIC_SHARED = re.compile(r"__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?[\w:<>,\s]+?\s+(\w+)\s*(?:\[[^\];]*\]\s*)*;")


def translate(text: str) -> str:
    def launch(m: re.Match) -> str:
        kernel = re.sub(r"\s+", " ", m.group(1)).strip()
        config = m.group(2)
        return (f'(::shardlm_emu::Launch(::shardlm_emu::fn_key({kernel}), "{kernel}", {config}) | '
                f'[=](auto&... emu_args) {{ {kernel}(emu_args...); }})')

    def shared(m: re.Match) -> str:
        return f"{m.group(1)}* {m.group(2)} = static_cast<{m.group(1)}*>(::shardlm_emu::dynamic_shared());"

    def fresh(m: re.Match) -> str:
        return f"{m.group(0)} ::shardlm_emu::fresh_shared(&{m.group(1)}, sizeof({m.group(1)}));"

    text = DYNAMIC_SHARED.sub(shared, text)
    text = STATIC_SHARED.sub(fresh, text)
    out = LAUNCH.sub(launch, text)
    if "<<<" in out or "extern __shared__" in out:
        raise SystemExit("translate_cu.py: a launch or dynamic shared array was left untranslated")
    return out


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        text = f.read()
    body = translate(text)
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    with open(dst, "w", encoding="utf-8") as f:
        f.write(f'#line 1 "{src}"\n{body}')


if __name__ == "__main__":
    main()
