// Test helper for fp8_torch_check.py (not installed): exposes model/fp8_block.h on files so that
// a Python script can compare it with torch bit for bit. Raw files are little-endian, no header.
//
//   fp8_dequant_tool dequant DIR WEIGHT SCALE BR BC R0 NR C0 NC OUT   checkpoint DIR -> bf16 [NR, NC]
//   fp8_dequant_tool decode OUT                                       the 256 codes -> f32 [256]
//   fp8_dequant_tool encode IN OUT                                    f32 [n] -> fp8 codes [n]
//   fp8_dequant_tool quantize IN R C BR BC OUT_Q OUT_SCALE            f32 [R, C] -> fp8 + f32 scales
//   fp8_dequant_tool bench R C [REPS]                                 dequant throughput (GB/s of fp8)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_util.h"
#include "model/checkpoint.h"
#include "model/fp8_block.h"

namespace {

using namespace shardlm;

void write_bytes(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  SHARDLM_CHECK(f.good(), "cannot write " << path);
}

int64_t arg(char** argv, int i) { return std::stoll(argv[i]); }

int usage() {
  std::cerr << "usage: fp8_dequant_tool dequant DIR WEIGHT SCALE BR BC R0 NR C0 NC OUT\n"
               "       fp8_dequant_tool decode OUT\n"
               "       fp8_dequant_tool encode IN OUT\n"
               "       fp8_dequant_tool quantize IN R C BR BC OUT_Q OUT_SCALE\n"
               "       fp8_dequant_tool bench R C [REPS]\n";
  return 2;
}

int run(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  if (cmd == "dequant" && argc == 12) {
    auto ck = Checkpoint::open(argv[2]);
    const TensorView& w = ck->get(argv[3]);
    const TensorView& s = ck->get(argv[4]);
    const int64_t nr = arg(argv, 8), nc = arg(argv, 10);
    std::vector<uint16_t> out(static_cast<size_t>(nr * nc));
    dequant_fp8_block(w, s, arg(argv, 5), arg(argv, 6), arg(argv, 7), nr, arg(argv, 9), nc, out.data());
    write_bytes(argv[11], out.data(), out.size() * 2);
    return 0;
  }
  if (cmd == "decode" && argc == 3) {
    std::vector<float> v(256);
    for (int c = 0; c < 256; ++c) v[c] = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    write_bytes(argv[2], v.data(), v.size() * 4);
    return 0;
  }
  if (cmd == "encode" && argc == 4) {
    const std::string in = read_file(argv[2]);
    SHARDLM_CHECK(in.size() % 4 == 0, argv[2] << ": size " << in.size() << " is not a multiple of 4");
    std::vector<uint8_t> out(in.size() / 4);
    for (size_t i = 0; i < out.size(); ++i) {
      float f;
      std::memcpy(&f, in.data() + 4 * i, 4);
      out[i] = f32_to_fp8_e4m3(f);
    }
    write_bytes(argv[3], out.data(), out.size());
    return 0;
  }
  if (cmd == "quantize" && argc == 9) {
    const std::string in = read_file(argv[2]);
    const int64_t R = arg(argv, 3), C = arg(argv, 4), br = arg(argv, 5), bc = arg(argv, 6);
    SHARDLM_CHECK(in.size() == static_cast<size_t>(R * C) * 4, argv[2] << ": size " << in.size() << " is not "
                                                                       << R << " x " << C << " floats");
    std::vector<float> w(static_cast<size_t>(R * C));
    std::memcpy(w.data(), in.data(), in.size());
    std::vector<uint8_t> q(w.size());
    std::vector<float> s(static_cast<size_t>(((R + br - 1) / br) * ((C + bc - 1) / bc)));
    quantize_fp8_block(w.data(), R, C, br, bc, q.data(), s.data());
    write_bytes(argv[7], q.data(), q.size());
    write_bytes(argv[8], s.data(), s.size() * 4);
    return 0;
  }
  if (cmd == "bench" && (argc == 4 || argc == 5)) {
    const int64_t R = arg(argv, 2), C = arg(argv, 3);
    const int reps = argc == 5 ? static_cast<int>(arg(argv, 4)) : 5;
    std::vector<uint8_t> q(static_cast<size_t>(R * C));
    std::mt19937 rng(1);
    for (auto& b : q) b = static_cast<uint8_t>(rng() & 0x7e);
    const int64_t sr = (R + 127) / 128, sc = (C + 127) / 128;
    std::vector<float> s(static_cast<size_t>(sr * sc));
    for (auto& x : s) x = 1e-3f * static_cast<float>(1 + rng() % 100);
    TensorView w{"w", "", DType::F8_E4M3, {R, C}, q.data(), q.size(), 0};
    TensorView sv{"w_scale_inv", "", DType::F32, {sr, sc}, s.data(), s.size() * 4, 0};
    std::vector<uint16_t> out(q.size(), 1);
    dequant_fp8_block(w, sv, 128, 128, 0, R, 0, C, out.data());  // warm-up
    // Wall time, and process CPU time (all threads): on a loaded machine the CPU time per byte is
    // the steadier figure.
    double best = 1e30, best_cpu = 1e30;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::clock_t c0 = std::clock();
      dequant_fp8_block(w, sv, 128, 128, 0, R, 0, C, out.data());
      const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, dt);
      best_cpu = std::min(best_cpu, cpu);
    }
    const double gb = static_cast<double>(q.size()) / 1e9;
    std::printf("dequant %lld x %lld (%.3f GB fp8): best wall %.1f ms = %.2f GB/s of fp8 input; "
                "best CPU time %.1f ms = %.2f GB/s per CPU-second\n",
                static_cast<long long>(R), static_cast<long long>(C), gb, best * 1e3, gb / best, best_cpu * 1e3,
                gb / best_cpu);
    return 0;
  }
  return usage();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "fp8_dequant_tool: " << e.what() << "\n";
    return 1;
  }
}
