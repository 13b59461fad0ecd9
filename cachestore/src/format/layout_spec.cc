// Layouts as configuration text (layout.h: ParseLayoutSpec).
#include <charconv>
#include <string>
#include <string_view>
#include <vector>

#include "strata/layout.h"
#include "strata/store_types.h"

namespace strata {
namespace {

// Splits on `sep`, keeping empty pieces (so "a;;b" is an error, not two).
std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t begin = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == sep) {
      parts.push_back(text.substr(begin, i - begin));
      begin = i + 1;
    }
  }
  return parts;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && p == text.data() + text.size() && !text.empty();
}

}  // namespace

Result<Layout> ParseLayoutSpec(std::string_view spec) {
  const std::string quoted = "layout '" + std::string(spec) + "': ";
  const std::vector<std::string_view> f = Split(Trim(spec), ':');
  if (f.size() != 4) {
    return InvalidArgument(quoted + "expected <id>:<kind>:<block_tokens>:<groups>");
  }
  Layout layout;
  // 0 means "no layout" everywhere else.
  if (!ParseNumber(f[0], &layout.id) || layout.id == 0) {
    return InvalidArgument(quoted + "id must be a number in 1..4294967295");
  }
  if (f[1] == "global_kv") {
    layout.kind = StateKind::kGlobalKv;
  } else if (f[1] == "swa_state") {
    layout.kind = StateKind::kSwaState;
  } else {
    return InvalidArgument(quoted + "kind must be global_kv or swa_state");
  }
  // A block the store could never match is refused here, not at every match.
  if (!ParseNumber(f[2], &layout.block_tokens) || layout.block_tokens == 0 ||
      layout.block_tokens > kMaxBlockTokens) {
    return InvalidArgument(quoted + "block_tokens must be a number in 1.." +
                           std::to_string(kMaxBlockTokens));
  }
  if (f[3] == "v41") {
    if (layout.kind != StateKind::kGlobalKv) {
      return InvalidArgument(quoted + "v41 groups are global_kv only");
    }
    // One of V4.1's sources keeps every second token.
    if (layout.block_tokens % 2 != 0) {
      return InvalidArgument(quoted + "v41 groups need an even block_tokens");
    }
    GlobalKvShape shape;
    shape.block_tokens = layout.block_tokens;
    layout.groups = MakeGlobalKvLayout(layout.id, shape).groups;
  } else {
    for (std::string_view g : Split(f[3], ',')) {
      const size_t eq = g.find('=');
      LayerGroup group;
      if (eq == std::string_view::npos || eq == 0 || !ParseNumber(g.substr(eq + 1), &group.bytes)) {
        return InvalidArgument(quoted + "groups must be name=bytes[,name=bytes...] or v41");
      }
      group.name = std::string(g.substr(0, eq));
      layout.groups.push_back(std::move(group));
    }
  }
  Status valid = layout.Validate();
  if (!valid.ok()) return InvalidArgument(quoted + valid.message());
  return layout;
}

Result<std::vector<Layout>> ParseLayoutSpecs(std::string_view specs) {
  std::vector<Layout> layouts;
  if (Trim(specs).empty()) return layouts;
  for (std::string_view spec : Split(specs, ';')) {
    Result<Layout> layout = ParseLayoutSpec(spec);
    if (!layout.ok()) return layout.status();
    for (const Layout& earlier : layouts) {
      if (earlier.id == layout->id) {
        return InvalidArgument("layout id " + std::to_string(earlier.id) + " appears twice");
      }
    }
    layouts.push_back(std::move(layout).value());
  }
  return layouts;
}

std::string FormatLayoutSpec(const Layout& layout) {
  std::string spec = std::to_string(layout.id) + ":" +
                     (layout.kind == StateKind::kGlobalKv ? "global_kv" : "swa_state") + ":" +
                     std::to_string(layout.block_tokens) + ":";
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    if (g > 0) spec += ",";
    spec += layout.groups[g].name + "=" + std::to_string(layout.groups[g].bytes);
  }
  return spec;
}

}  // namespace strata
