#!/usr/bin/env python3
"""Cross-checks shardlm's FP8 e4m3 block-scaled code (src/model/fp8_block.cpp) against torch.

Through fp8_dequant_tool (tests/model/fp8_dequant_tool.cpp), bit for bit:
  * decode: the 256 codes against torch.arange(256, dtype=uint8).view(float8_e4m3fn).float();
  * encode: random f32 values of every magnitude, the exact midpoints between neighbouring codes
    and the values around them against .to(float8_e4m3fn) (torch does not saturate: values that
    round past 448 become NaN there, so those are compared against the clamped value instead);
  * dequantisation: a safetensors checkpoint written with the `safetensors` package (fp8 weights,
    F32 and BF16 128x128 block scales, shapes not multiples of 128, every code including NaN) read
    by shardlm's Checkpoint, against the Hugging Face / DeepSeek reference
    (w.float() * s.repeat_interleave(...)).to(bfloat16), whole tensors and slices;
  * quantisation: per block scale = amax / 448, q = (w / scale).to(float8_e4m3fn).

Exit code 77 (CTest: skipped) when torch, numpy or safetensors is not installed.
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from safetensors.torch import save_file
except ImportError as e:  # pragma: no cover
    print(f"fp8_torch_check: skipped, {e.name} is not installed (pip install torch numpy safetensors)")
    sys.exit(77)

if not hasattr(torch, "float8_e4m3fn"):  # pragma: no cover
    print(f"fp8_torch_check: skipped, torch {torch.__version__} has no float8_e4m3fn")
    sys.exit(77)

FP8 = torch.float8_e4m3fn
failures = []


def check(name, ok, detail=""):
    print(f"{name:72s} {'ok' if ok else 'FAIL'} {detail}")
    if not ok:
        failures.append(name)


def tool(args, *rest):
    subprocess.run([args.tool, *map(str, rest)], check=True)


def read_raw(path, dtype):
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=dtype)


def ref_dequant(w, s, br, bc):
    """The Hugging Face (finegrained fp8) / DeepSeek reference: fp32 product rounded to bf16."""
    R, C = w.shape
    sf = s.float().repeat_interleave(br, 0)[:R].repeat_interleave(bc, 1)[:, :C]
    return (w.float() * sf).to(torch.bfloat16)


def bf16_equal(ours_u16, ref_bf16):
    """Bitwise equality, NaN compared as NaN (torch canonicalises the NaN payload and sign)."""
    ref = ref_bf16.contiguous().view(torch.int16).numpy().view(np.uint16).reshape(-1)
    ours = ours_u16.reshape(-1)
    ref_nan = np.isnan(ref_bf16.float().numpy().reshape(-1))
    ours_nan = ((ours & 0x7FFF) > 0x7F80)
    same = (ours == ref) | (ref_nan & ours_nan)
    return bool(same.all() and (ref_nan == ours_nan).all()), int((~same).sum())


def check_decode(args, work):
    out = os.path.join(work, "decode.f32")
    tool(args, "decode", out)
    ours = read_raw(out, np.float32)
    ref = torch.arange(256, dtype=torch.uint8).view(FP8).float().numpy()
    nan_ok = np.array_equal(np.isnan(ours), np.isnan(ref))
    fin = ~np.isnan(ref)
    bits_ok = np.array_equal(ours[fin].view(np.uint32), ref[fin].view(np.uint32))  # -0 included
    check("decode: 256 codes vs torch float8_e4m3fn", nan_ok and bits_ok, f"({int(np.isnan(ref).sum())} NaN codes)")


def check_encode(args, work, rng):
    codes = torch.arange(256, dtype=torch.uint8)
    vals = codes.view(FP8).double().numpy()
    pos = np.sort(vals[(vals >= 0) & ~np.isnan(vals)])
    mids = ((pos[1:] + pos[:-1]) / 2).astype(np.float32)  # exact in f32
    assert np.array_equal(mids.astype(np.float64), (pos[1:] + pos[:-1]) / 2)
    special = np.concatenate([
        mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(1e9)),
        pos.astype(np.float32),
        np.array([0.0, 2.0**-10, 2.0**-9, 2.0**-6, 448.0, 455.9, 463.99, np.finfo(np.float32).tiny,
                  np.finfo(np.float32).smallest_subnormal], dtype=np.float32),
    ])
    mags = (2.0 ** rng.uniform(-14, 9.9, size=200000)).astype(np.float32)
    x = np.concatenate([special, -special, mags * np.where(rng.random(mags.size) < 0.5, -1, 1)]).astype(np.float32)
    x = np.concatenate([x, np.array([500.0, -1e6, np.inf, -np.inf], dtype=np.float32)])
    inp, out = os.path.join(work, "enc.f32"), os.path.join(work, "enc.u8")
    x.tofile(inp)
    tool(args, "encode", inp, out)
    ours = read_raw(out, np.uint8)
    # torch does not saturate (>= 464 becomes NaN); the DeepSeek quantiser clamps first.
    ref = torch.from_numpy(np.clip(x, -448.0, 448.0)).to(FP8).view(torch.uint8).numpy()
    bad = int((ours != ref).sum())
    check("encode: %d f32 values (ties, subnormals, saturation) vs torch" % x.size, bad == 0,
          f"({bad} differ)" if bad else "")
    nan_in = np.array([np.nan], dtype=np.float32)
    nan_in.tofile(inp)
    tool(args, "encode", inp, out)
    check("encode: NaN -> NaN code", (read_raw(out, np.uint8)[0] & 0x7F) == 0x7F)


def check_dequant(args, work, rng):
    g = torch.Generator().manual_seed(7)
    tensors = {}
    cases = []  # (weight name, scale name, R, C, br, bc)

    def add(name, R, C, br, bc, scale_dtype, codes=None):
        if codes is None:
            codes = torch.randint(0, 256, (R, C), dtype=torch.uint8, generator=g)
        sr, sc = -(-R // br), -(-C // bc)
        scales = torch.exp(torch.randn(sr, sc, generator=g) * 4).to(torch.float32)
        scales[0, 0] = 1.0
        if sr * sc > 2:
            scales.view(-1)[1] = -0.37
            scales.view(-1)[2] = 3.3e-39  # subnormal f32 scale
        tensors[name] = codes.view(FP8)
        tensors[name + "_scale_inv"] = scales.to(scale_dtype)
        cases.append((name, name + "_scale_inv", R, C, br, bc))

    add("layers.0.mlp.down_proj.weight", 300, 200, 128, 128, torch.float32)
    add("layers.0.mlp.up_proj.weight", 257, 385, 128, 128, torch.bfloat16)
    allc = (torch.arange(512).view(-1, 1) + torch.arange(256).view(1, -1)) % 256
    add("layers.1.self_attn.q_proj.weight", 512, 256, 128, 128, torch.float32, allc.to(torch.uint8))
    add("layers.1.self_attn.o_proj.weight", 100, 70, 32, 16, torch.float32)  # other block sizes
    ckpt = os.path.join(work, "ckpt")
    os.makedirs(ckpt)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(ckpt, "model.safetensors"))

    out = os.path.join(work, "deq.bf16")
    for (wn, sn, R, C, br, bc) in cases:
        w, s = tensors[wn], tensors[sn]
        ref = ref_dequant(w, s, br, bc)
        slices = [(0, R, 0, C), (37, R - 50, 51, C - 60), (br - 1, 2, bc - 1, 2), (R - 1, 1, 0, C),
                  (5, 1, 3, 1), (br + 3, R - br - 3, bc + 1, C - bc - 1)]
        for (r0, nr, c0, nc) in slices:
            tool(args, "dequant", ckpt, wn, sn, br, bc, r0, nr, c0, nc, out)
            ours = read_raw(out, np.uint16)
            ok, nbad = bf16_equal(ours, ref[r0:r0 + nr, c0:c0 + nc])
            check(f"dequant {wn} [{R}, {C}] {str(s.dtype)[6:]} rows {r0}+{nr} cols {c0}+{nc}", ok,
                  f"({nbad} differ)" if nbad else "")


def check_quantize(args, work, rng):
    R, C, br, bc = 300, 200, 128, 128
    w = torch.from_numpy(rng.standard_normal((R, C)).astype(np.float32))
    w[:128, 128:] *= 1e-3
    w[128:256, :128] = 0.0  # all-zero block: scale 1
    w[256:, 128:] *= 300.0
    inp, oq, osc = (os.path.join(work, n) for n in ("q.f32", "q.u8", "q.scale"))
    w.numpy().tofile(inp)
    tool(args, "quantize", inp, R, C, br, bc, oq, osc)
    q = read_raw(oq, np.uint8).reshape(R, C)
    sc = read_raw(osc, np.float32).reshape(-(-R // br), -(-C // bc))
    # Reference: amax per block / 448 (1 for zero blocks), then (w / scale).to(float8_e4m3fn).
    pad = torch.zeros(-(-R // br) * br, -(-C // bc) * bc)
    pad[:R, :C] = w.abs()
    amax = pad.view(-(-R // br), br, -(-C // bc), bc).amax(dim=(1, 3))
    scale = amax / 448.0
    scale[amax == 0] = 1.0
    sfull = scale.repeat_interleave(br, 0)[:R].repeat_interleave(bc, 1)[:, :C]
    qref = (w / sfull).clamp(-448, 448).to(FP8).view(torch.uint8).numpy()
    check("quantize: scales = amax / 448 vs torch", np.array_equal(sc.view(np.uint32), scale.numpy().view(np.uint32)))
    nbad = int((q != qref).sum())
    check("quantize: codes vs (w / scale).to(float8_e4m3fn)", nbad == 0, f"({nbad} differ)" if nbad else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", required=True, help="path of the fp8_dequant_tool executable")
    args = ap.parse_args()
    rng = np.random.default_rng(2024)
    print(f"torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="shardlm_fp8_") as work:
        check_decode(args, work)
        check_encode(args, work, rng)
        check_dequant(args, work, rng)
        check_quantize(args, work, rng)
    if failures:
        print(f"fp8_torch_check: {len(failures)} check(s) failed")
        return 1
    print("fp8_torch_check: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
