#include "strata/json_text.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(JsonTextTest, QuotesAndEscapesWhatJsonRequires) {
  EXPECT_EQ(JsonString(""), "\"\"");
  EXPECT_EQ(JsonString("plain /path é"), "\"plain /path é\"");
  EXPECT_EQ(JsonString("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonString("l1\nl2\tx\r"), "\"l1\\nl2\\tx\\r\"");
  EXPECT_EQ(JsonString(std::string_view("\x01\x1f\0", 3)), "\"\\u0001\\u001f\\u0000\"");
  std::string out = "[";
  AppendJsonString("k", &out);
  EXPECT_EQ(out, "[\"k\"");
}

}  // namespace
}  // namespace strata
