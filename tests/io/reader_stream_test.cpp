// The reader streams: memory stays flat on a file far larger than the allowed growth.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "io/request_reader.h"
#include "io_test_util.h"

namespace shardlm {
namespace {

TEST(RequestReaderStream, TwoHundredThousandLinesKeepRssFlat) {
  test::ScratchDir dir;
  const std::string path = dir.file("big.jsonl");
  constexpr int kLines = 200000;
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    for (int i = 0; i < kLines; ++i)
      std::fprintf(f,
                   "{\"id\": \"req-%07d\", \"prompt\": \"Once upon a time there was a little robot number %d who "
                   "wanted to see the sea, the stars, the tall mountains and the big city where the lights never go "
                   "out at night.\", \"max_tokens\": %d, \"temperature\": 0.%d, "
                   "\"stop\": [\"\\n\"]}\n",
                   i, i, 1 + i % 512, i % 10);
    std::fclose(f);
  }
  const auto file_bytes = std::filesystem::file_size(path);
  ASSERT_GT(file_bytes, 40u << 20) << "the file must dwarf the allowed RSS growth for the test to mean anything";

  RequestReader reader(path, PromptFormat::kAuto);
  const long rss0 = test::rss_kib();
  ASSERT_GT(rss0, 0) << "/proc/self/status has no VmRSS";
  long peak = rss0;
  int64_t n = 0, errors = 0, max_tokens_sum = 0;
  std::string last_id;
  while (auto r = reader.next()) {
    ++n;
    if (!r->error.empty()) ++errors;
    max_tokens_sum += r->overrides.max_tokens.value_or(0);
    if (n % 5000 == 0) peak = std::max(peak, test::rss_kib());
    last_id = r->id;
  }
  peak = std::max(peak, test::rss_kib());
  EXPECT_EQ(n, kLines);
  EXPECT_EQ(errors, 0);
  EXPECT_EQ(last_id, "req-0199999");
  int64_t want_sum = 0;
  for (int i = 0; i < kLines; ++i) want_sum += 1 + i % 512;
  EXPECT_EQ(max_tokens_sum, want_sum);
  const long grown_kib = peak - rss0;
#if SHARDLM_IO_ASAN
  std::printf("AddressSanitizer build: RSS growth (%ld KiB) not checked\n", grown_kib);
#else
  EXPECT_LT(grown_kib, 20 * 1024) << "RSS grew by " << grown_kib << " KiB reading a " << (file_bytes >> 20)
                                  << " MiB file";
#endif
  std::printf("read %lld lines (%llu MiB): RSS %ld KiB -> peak %ld KiB\n", static_cast<long long>(n),
              static_cast<unsigned long long>(file_bytes >> 20), rss0, peak);
}

}  // namespace
}  // namespace shardlm
