// JSON string literals for the text our tools and logs print.
#pragma once

#include <string>
#include <string_view>

namespace strata {

// Appends `text` as a JSON string literal, quotes included: '"', '\' and
// control characters escaped (RFC 8259); other bytes pass through.
void AppendJsonString(std::string_view text, std::string* out);
std::string JsonString(std::string_view text);

}  // namespace strata
