#include "strata/trace/trace.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>

#include "strata/store_types.h"

namespace strata::trace {
namespace {

// A cursor over one line of JSON restricted to what the format needs: an
// object of integer and integer-array fields. Unknown fields are skipped if
// they are integers or strings without escapes; any other value rejects the
// line with a message naming the field.
class Cursor {
 public:
  explicit Cursor(std::string_view s) : s_(s) {}
  void SkipSpace() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool Eat(char c) {
    SkipSpace();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool AtEnd() {
    SkipSpace();
    return i_ == s_.size();
  }
  bool String(std::string_view* out) {
    if (!Eat('"')) return false;
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') return false;  // no escapes in this format
      ++i_;
    }
    if (i_ == s_.size()) return false;
    *out = s_.substr(start, i_ - start);
    ++i_;
    return true;
  }
  bool Int(int64_t* out) {
    SkipSpace();
    const char* begin = s_.data() + i_;
    const char* end = s_.data() + s_.size();
    auto [ptr, ec] = std::from_chars(begin, end, *out);
    if (ec != std::errc() || ptr == begin) return false;
    i_ += static_cast<size_t>(ptr - begin);
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) return false;
    return true;
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
};

Status Bad(const std::string& what) { return InvalidArgument("trace line: " + what); }

}  // namespace

Status ParseTraceLine(std::string_view line, TraceRequest* out) {
  *out = TraceRequest{};
  Cursor c(line);
  if (!c.Eat('{')) return Bad("expected '{'");
  bool have_ts = false, have_in = false, have_ids = false, have_out = false;
  if (!c.Eat('}')) {
    do {
      std::string_view key;
      if (!c.String(&key)) return Bad("expected a quoted field name");
      if (!c.Eat(':')) return Bad("expected ':' after \"" + std::string(key) + "\"");
      // A field given twice would be read one way here, another elsewhere.
      bool* seen = key == "hash_ids"        ? &have_ids
                   : key == "timestamp"     ? &have_ts
                   : key == "input_length"  ? &have_in
                   : key == "output_length" ? &have_out
                                            : nullptr;
      if (seen != nullptr && *seen) return Bad("field \"" + std::string(key) + "\" appears twice");
      if (key == "hash_ids") {
        if (!c.Eat('[')) return Bad("hash_ids must be an array");
        if (!c.Eat(']')) {
          do {
            int64_t v;
            if (!c.Int(&v) || v < 0) return Bad("hash_ids must hold non-negative integers");
            // The store matches at most this many blocks in one call.
            if (out->hash_ids.size() == kMaxBlocksPerCall) {
              return Bad("more than " + std::to_string(kMaxBlocksPerCall) + " hash_ids");
            }
            out->hash_ids.push_back(static_cast<uint64_t>(v));
          } while (c.Eat(','));
          if (!c.Eat(']')) return Bad("unterminated hash_ids");
        }
        have_ids = true;
        continue;
      }
      int64_t v;
      std::string_view ignored;
      if (c.Int(&v)) {
        if (key == "timestamp") {
          out->timestamp_ms = v;
          have_ts = true;
        } else if (key == "input_length" || key == "output_length") {
          if (v < 0) return Bad(std::string(key) + " must not be negative");
          (key == "input_length" ? out->input_length : out->output_length) =
              static_cast<uint64_t>(v);
          *seen = true;
        }
      } else if (!c.String(&ignored)) {
        return Bad("field \"" + std::string(key) + "\" has an unsupported value");
      }
    } while (c.Eat(','));
    if (!c.Eat('}')) return Bad("expected ',' or '}'");
  }
  if (!c.AtEnd()) return Bad("trailing characters after the object");
  if (!have_ts || !have_in || !have_ids) {
    return Bad("needs timestamp, input_length and hash_ids");
  }
  // One id per block of the input, the last one partial.
  const uint64_t blocks = (out->input_length + kTraceBlockTokens - 1) / kTraceBlockTokens;
  if (out->hash_ids.size() != blocks) {
    return Bad("input_length " + std::to_string(out->input_length) + " spans " +
               std::to_string(blocks) + " blocks of " + std::to_string(kTraceBlockTokens) +
               " tokens, hash_ids has " + std::to_string(out->hash_ids.size()));
  }
  return Status::Ok();
}

std::string FormatTraceLine(const TraceRequest& r) {
  std::string s = "{\"timestamp\": " + std::to_string(r.timestamp_ms) +
                  ", \"input_length\": " + std::to_string(r.input_length) +
                  ", \"output_length\": " + std::to_string(r.output_length) + ", \"hash_ids\": [";
  for (size_t i = 0; i < r.hash_ids.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(r.hash_ids[i]);
  }
  return s + "]}";
}

Result<std::vector<TraceRequest>> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open trace " + path);
  std::vector<TraceRequest> out;
  std::string line;
  size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    TraceRequest r;
    Status st = ParseTraceLine(line, &r);
    if (!st.ok()) return InvalidArgument(path + ":" + std::to_string(number) + ": " + st.message());
    out.push_back(std::move(r));
  }
  // A directory opens and reads nothing; a failing disk ends the loop early.
  if (in.bad() || std::filesystem::is_directory(path)) {
    return InvalidArgument("cannot read trace " + path + " (a directory, or a read error)");
  }
  return out;
}

Status WriteTrace(const std::string& path, const std::vector<TraceRequest>& requests) {
  std::ofstream out(path);
  if (!out) return Unavailable("cannot write " + path);
  for (const TraceRequest& r : requests) out << FormatTraceLine(r) << '\n';
  out.flush();
  return out ? Status::Ok() : Unavailable("write to " + path + " failed");
}

uint64_t PrefixTokens(const TraceRequest& r, size_t blocks) {
  const uint64_t full = uint64_t{kTraceBlockTokens} * blocks;
  return std::min<uint64_t>(full, r.input_length);
}

uint64_t InputTokens(const std::vector<TraceRequest>& requests) {
  uint64_t n = 0;
  for (const TraceRequest& r : requests) n += r.input_length;
  return n;
}

}  // namespace strata::trace
