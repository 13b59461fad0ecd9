#include "strata/worker/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <variant>

namespace strata::worker {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit
constexpr uint64_t kMaxFileBytes = 64ull << 30;
// JSON values a header may hold (a tensor takes about ten). Parsed values
// take ~40 bytes each: a 100 MiB header of one-byte values would otherwise
// take gigabytes before its structure is checked.
constexpr uint64_t kMaxHeaderValues = 1ull << 20;

// A small JSON reader, enough for a safetensors header: objects, arrays,
// strings (with escapes), non-negative integers, true/false/null.
struct Json {
  std::variant<std::nullptr_t, uint64_t, std::string, std::vector<Json>,
               std::vector<std::pair<std::string, Json>>>
      v;
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}

  Result<Json> ParseDocument() {
    Result<Json> j = Parse(0);
    if (!j.ok()) return j;
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing bytes");
    return j;
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument("safetensors header: " + what + " at byte " + std::to_string(pos_));
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool Eat(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  Result<std::string> ParseString() {
    if (!Eat('"')) return Error("expected a string");
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (c == '\\') {
        if (pos_ >= s_.size()) return Error("bad escape");
        char e = s_[pos_++];
        switch (e) {
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'u': {
            if (pos_ + 4 > s_.size()) return Error("bad \\u escape");
            unsigned cp = 0;
            for (int i = 0; i < 4; ++i) {
              const char h = s_[pos_++];
              cp <<= 4;
              if (h >= '0' && h <= '9')
                cp |= unsigned(h - '0');
              else if (h >= 'a' && h <= 'f')
                cp |= unsigned(h - 'a' + 10);
              else if (h >= 'A' && h <= 'F')
                cp |= unsigned(h - 'A' + 10);
              else
                return Error("bad \\u escape");
            }
            if (cp < 0x80) {
              out += static_cast<char>(cp);
            } else if (cp < 0x800) {
              out += static_cast<char>(0xc0 | (cp >> 6));
              out += static_cast<char>(0x80 | (cp & 0x3f));
            } else {
              out += static_cast<char>(0xe0 | (cp >> 12));
              out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
              out += static_cast<char>(0x80 | (cp & 0x3f));
            }
            break;
          }
          default:
            out += e;  // \" \\ \/
        }
      } else {
        out += c;
      }
    }
    if (pos_ >= s_.size()) return Error("unterminated string");
    ++pos_;
    return out;
  }
  Result<Json> Parse(int depth) {
    if (depth > 8) return Error("nested too deeply");
    if (++values_ > kMaxHeaderValues) {
      return Error("more than " + std::to_string(kMaxHeaderValues) + " values");
    }
    SkipSpace();
    if (pos_ >= s_.size()) return Error("unexpected end");
    const char c = s_[pos_];
    if (c == '{') {
      ++pos_;
      std::vector<std::pair<std::string, Json>> members;
      if (Eat('}')) return Json{std::move(members)};
      do {
        Result<std::string> key = ParseString();
        if (!key.ok()) return key.status();
        if (!Eat(':')) return Error("expected ':'");
        Result<Json> value = Parse(depth + 1);
        if (!value.ok()) return value;
        members.emplace_back(std::move(key).value(), std::move(value).value());
      } while (Eat(','));
      if (!Eat('}')) return Error("expected '}'");
      return Json{std::move(members)};
    }
    if (c == '[') {
      ++pos_;
      std::vector<Json> items;
      if (Eat(']')) return Json{std::move(items)};
      do {
        Result<Json> value = Parse(depth + 1);
        if (!value.ok()) return value;
        items.push_back(std::move(value).value());
      } while (Eat(','));
      if (!Eat(']')) return Error("expected ']'");
      return Json{std::move(items)};
    }
    if (c == '"') {
      Result<std::string> s = ParseString();
      if (!s.ok()) return s.status();
      return Json{std::move(s).value()};
    }
    if (c >= '0' && c <= '9') {
      uint64_t v = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (v > (UINT64_MAX - 9) / 10) return Error("integer too large");
        v = v * 10 + uint64_t(s_[pos_++] - '0');
      }
      return Json{v};
    }
    for (std::string_view lit : {"null", "true", "false"}) {
      if (s_.substr(pos_, lit.size()) == lit) {
        pos_ += lit.size();
        return Json{nullptr};
      }
    }
    return Error("unexpected character");
  }

  std::string_view s_;
  size_t pos_ = 0;
  uint64_t values_ = 0;
};

void AppendJsonString(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

Status TensorError(const std::string& name, const std::string& why) {
  return InvalidArgument("safetensors: tensor '" + name + "': " + why);
}

}  // namespace

uint64_t Tensor::Elements() const {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (n > UINT64_MAX / d) return UINT64_MAX;  // saturates: larger than any file
    n *= d;
  }
  return n;
}

Status WriteSafetensors(const std::string& path, const SafetensorsFile& file) {
  std::string header = "{";
  bool first = true;
  if (!file.metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [k, v] : file.metadata) {
      if (!first) header += ',';
      first = false;
      AppendJsonString(header, k);
      header += ':';
      AppendJsonString(header, v);
    }
    header += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    if (t.dtype != "F32" || t.data.size() != t.Elements()) {
      return TensorError(name, "only F32 tensors whose data matches their shape can be written");
    }
    if (!first) header += ',';
    first = false;
    AppendJsonString(header, name);
    header += ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) header += ',';
      header += std::to_string(t.shape[i]);
    }
    const uint64_t bytes = t.data.size() * sizeof(float);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += '}';
  while (header.size() % 8 != 0) header += ' ';  // aligns the data, as the reference writer does
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return InvalidArgument("cannot create '" + path + "'");
  const uint64_t n = header.size();
  char len[8];
  std::memcpy(len, &n, 8);  // little-endian host
  out.write(len, 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& [name, t] : file.tensors) {
    out.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size() * sizeof(float)));
  }
  out.close();
  if (!out) return Unavailable("writing '" + path + "' failed");
  return Status::Ok();
}

Result<SafetensorsFile> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return NotFound("cannot open model file '" + path + "'");
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  if (size < 8 || size > kMaxFileBytes) {
    return InvalidArgument("'" + path + "' is not a safetensors file (size " +
                           std::to_string(size) + ")");
  }
  in.seekg(0);
  uint64_t n = 0;
  char len[8];
  in.read(len, 8);
  std::memcpy(&n, len, 8);
  if (n < 2 || n > kMaxHeaderBytes || n > size - 8) {
    return InvalidArgument("'" + path + "': header length " + std::to_string(n) +
                           " does not fit the file");
  }
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  if (!in) return InvalidArgument("'" + path + "': short read of the header");
  Result<Json> doc = JsonParser(header).ParseDocument();
  if (!doc.ok()) return doc.status();
  using Object = std::vector<std::pair<std::string, Json>>;
  const Object* root = std::get_if<Object>(&doc->v);
  if (root == nullptr) return InvalidArgument("safetensors header is not a JSON object");

  const uint64_t data_bytes = size - 8 - n;
  SafetensorsFile file;
  struct Span {
    std::string name;
    uint64_t begin, end;
  };
  std::vector<Span> spans;
  for (const auto& [name, value] : *root) {
    const Object* obj = std::get_if<Object>(&value.v);
    if (name == "__metadata__") {
      if (obj == nullptr) return InvalidArgument("safetensors: __metadata__ is not an object");
      for (const auto& [k, v] : *obj) {
        const std::string* s = std::get_if<std::string>(&v.v);
        if (s == nullptr) return InvalidArgument("safetensors: metadata '" + k + "' not a string");
        file.metadata[k] = *s;
      }
      continue;
    }
    if (obj == nullptr) return TensorError(name, "entry is not an object");
    if (file.tensors.count(name)) return TensorError(name, "appears twice");
    Tensor t;
    const std::vector<Json>* offsets = nullptr;
    bool has_dtype = false, has_shape = false;
    for (const auto& [k, v] : *obj) {
      if (k == "dtype") {
        const std::string* s = std::get_if<std::string>(&v.v);
        if (s == nullptr) return TensorError(name, "dtype is not a string");
        t.dtype = *s;
        has_dtype = true;
      } else if (k == "shape") {
        const auto* dims = std::get_if<std::vector<Json>>(&v.v);
        if (dims == nullptr || dims->size() > 8) return TensorError(name, "bad shape");
        for (const Json& d : *dims) {
          const uint64_t* u = std::get_if<uint64_t>(&d.v);
          if (u == nullptr || *u > (1ull << 32)) return TensorError(name, "bad shape");
          t.shape.push_back(*u);
        }
        has_shape = true;
      } else if (k == "data_offsets") {
        offsets = std::get_if<std::vector<Json>>(&v.v);
      }
    }
    if (!has_dtype || !has_shape || offsets == nullptr || offsets->size() != 2) {
      return TensorError(name, "needs dtype, shape and data_offsets [begin, end]");
    }
    const uint64_t* b = std::get_if<uint64_t>(&(*offsets)[0].v);
    const uint64_t* e = std::get_if<uint64_t>(&(*offsets)[1].v);
    if (b == nullptr || e == nullptr || *b > *e || *e > data_bytes) {
      return TensorError(name, "data_offsets lie outside the file");
    }
    if (t.Elements() > data_bytes) return TensorError(name, "shape larger than the file");
    if (t.dtype == "F32") {
      if (*e - *b != t.Elements() * sizeof(float)) {
        return TensorError(name, "F32 shape needs " + std::to_string(t.Elements() * 4) +
                                     " bytes, data_offsets give " + std::to_string(*e - *b));
      }
      t.data.resize(t.Elements());
      in.seekg(static_cast<std::streamoff>(8 + n + *b));
      in.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(*e - *b));
      if (!in) return TensorError(name, "short read");
    }
    spans.push_back({name, *b, *e});
    file.tensors.emplace(name, std::move(t));
  }
  // Tensors must not overlap (the format forbids it; an overlap means a
  // corrupt or hand-crafted file).
  std::sort(spans.begin(), spans.end(),
            [](const Span& x, const Span& y) { return x.begin < y.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end) {
      return TensorError(spans[i].name, "overlaps tensor '" + spans[i - 1].name + "'");
    }
  }
  return file;
}

}  // namespace strata::worker
