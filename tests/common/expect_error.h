// An error check that reads the message: the project's errors name what was wrong (the file, the
// tensor, the flag), and a test that only sees "something threw" passes when another check fires.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "core/error.h"

namespace shardlm::test {

// Runs fn, which must throw shardlm::Error whose message contains every needle.
template <typename Fn>
void expect_error(Fn fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "no Error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

}  // namespace shardlm::test
