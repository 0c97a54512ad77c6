#include "core/utf8.h"

#include <gtest/gtest.h>

namespace shardlm {
namespace {

TEST(Utf8, AcceptsWellFormedText) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("caf\xC3\xA9 \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82"));  // café 世界 🙂
  EXPECT_TRUE(is_valid_utf8("\xF4\x8F\xBF\xBF"));                                     // U+10FFFF
  EXPECT_TRUE(is_valid_utf8(std::string("nul\0inside", 10)));
}

TEST(Utf8, RejectsEachKindOfBadSequence) {
  EXPECT_FALSE(is_valid_utf8("\x80"));              // lone continuation byte
  EXPECT_FALSE(is_valid_utf8("\xC0\x80"));          // overlong NUL
  EXPECT_FALSE(is_valid_utf8("\xE0\x80\xAF"));      // overlong '/'
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate U+D800
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("ab\xE2\x82"));        // truncated at the end
  EXPECT_FALSE(is_valid_utf8("\xFF"));
  EXPECT_FALSE(is_valid_utf8("caf\xC3("));          // lead byte followed by ASCII
}

TEST(Utf8, RepairReplacesMaximalBadSubparts) {
  EXPECT_EQ(repair_utf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(repair_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(repair_utf8("x\xE2\x82"), "x\xEF\xBF\xBD");  // one U+FFFD for the truncated sequence
  EXPECT_EQ(repair_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(is_valid_utf8(repair_utf8("\xC0\x80\xF5\xBF zz \xF0\x9F\x99")));
}

// Whether more bytes could complete the end: a well-formed beginning of a sequence, at its last
// lead, not an earlier one's.
TEST(Utf8, EndsInTruncatedCharacter) {
  EXPECT_TRUE(ends_in_truncated_character("\xE4"));
  EXPECT_TRUE(ends_in_truncated_character("x\xE4\xBD"));
  EXPECT_TRUE(ends_in_truncated_character("\xF0\x9F\x98"));
  EXPECT_TRUE(ends_in_truncated_character("\xD5\xE4"));      // D5 is done (bad); E4 may go on
  EXPECT_TRUE(ends_in_truncated_character("\xC3\xA9\xE4"));  // after a whole character
  EXPECT_FALSE(ends_in_truncated_character(""));
  EXPECT_FALSE(ends_in_truncated_character("abc"));
  EXPECT_FALSE(ends_in_truncated_character("\xE4\xBD\xA0"));  // complete
  EXPECT_FALSE(ends_in_truncated_character("\x80"));          // begins nothing
  EXPECT_FALSE(ends_in_truncated_character("\xE4\x41"));      // ended by 'A'
  EXPECT_FALSE(ends_in_truncated_character("\xE0\x80"));      // overlong: no byte can mend it
  EXPECT_FALSE(ends_in_truncated_character("\xED\xA0"));      // a surrogate's beginning
  EXPECT_FALSE(ends_in_truncated_character("\xF5"));
  EXPECT_FALSE(ends_in_truncated_character("\xF0\x9F\x98\x80\x80"));
}

}  // namespace
}  // namespace shardlm
