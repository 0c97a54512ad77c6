// Comparisons of a GPU result with its CPU reference, reporting how many elements differ and the
// first few of them.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

namespace shardlm::test {

// |got - want| <= rel * |want| + abs elementwise (a NaN on either side is a mismatch).
inline ::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                                            double abs) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  std::ostringstream first;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::fabs(g - w) <= rel * std::fabs(w) + abs;  // false for a NaN
    if (ok) continue;
    if (bad < 5) first << "\n  [" << i << "] got " << g << " want " << w << " (diff " << std::fabs(g - w) << ")";
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements off (rel " << rel << ", abs "
                                       << abs << ")" << first.str();
}

// Bit-for-bit equality (NaNs compare by their bits).
template <typename T>
::testing::AssertionResult all_bits_equal(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements differ, first at [" << first
                                       << "]: got " << +got[first] << " want " << +want[first];
}

}  // namespace shardlm::test
