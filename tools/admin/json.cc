#include "json.h"

#include <cmath>
#include <cstdio>

#include "strata/json_text.h"

namespace strata::admin {

Json& Json::Set(const std::string& key, Json value) {
  auto& members = std::get<Object>(v_);
  for (auto& [k, v] : members) {
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  }
  members.emplace_back(key, std::move(value));
  return *this;
}

Json& Json::Push(Json value) {
  std::get<Array>(v_).push_back(std::move(value));
  return *this;
}

bool Json::empty() const {
  if (const auto* a = std::get_if<Array>(&v_)) return a->empty();
  if (const auto* o = std::get_if<Object>(&v_)) return o->empty();
  return std::holds_alternative<std::monostate>(v_);
}

std::string Json::Dump() const {
  std::string out;
  DumpTo(&out);
  return out;
}

void Json::DumpTo(std::string* out) const {
  if (std::holds_alternative<std::monostate>(v_)) {
    *out += "null";
  } else if (const bool* b = std::get_if<bool>(&v_)) {
    *out += *b ? "true" : "false";
  } else if (const int64_t* iv = std::get_if<int64_t>(&v_)) {
    *out += std::to_string(*iv);
  } else if (const uint64_t* u = std::get_if<uint64_t>(&v_)) {
    *out += std::to_string(*u);
  } else if (const double* d = std::get_if<double>(&v_)) {
    if (!std::isfinite(*d)) {
      *out += "null";  // JSON has no NaN or infinity
    } else {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.9g", *d);
      *out += buf;
    }
  } else if (const std::string* s = std::get_if<std::string>(&v_)) {
    AppendJsonString(*s, out);
  } else if (const Array* a = std::get_if<Array>(&v_)) {
    out->push_back('[');
    for (size_t i = 0; i < a->size(); ++i) {
      if (i > 0) out->push_back(',');
      (*a)[i].DumpTo(out);
    }
    out->push_back(']');
  } else if (const Object* o = std::get_if<Object>(&v_)) {
    out->push_back('{');
    for (size_t i = 0; i < o->size(); ++i) {
      if (i > 0) out->push_back(',');
      AppendJsonString((*o)[i].first, out);
      out->push_back(':');
      (*o)[i].second.DumpTo(out);
    }
    out->push_back('}');
  }
}

}  // namespace strata::admin
