// A small JSON value for strata-admin's --json output: objects keep their
// insertion order so the output reads like the table it mirrors.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace strata::admin {

class Json {
 public:
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;

  Json() = default;                            // null
  Json(bool v) : v_(v) {}                      // NOLINT(google-explicit-constructor)
  Json(int v) : v_(int64_t{v}) {}              // NOLINT(google-explicit-constructor)
  Json(int64_t v) : v_(v) {}                   // NOLINT(google-explicit-constructor)
  Json(uint32_t v) : v_(uint64_t{v}) {}        // NOLINT(google-explicit-constructor)
  Json(uint64_t v) : v_(v) {}                  // NOLINT(google-explicit-constructor)
  Json(double v) : v_(v) {}                    // NOLINT(google-explicit-constructor)
  Json(std::string v) : v_(std::move(v)) {}    // NOLINT(google-explicit-constructor)
  Json(const char* v) : v_(std::string(v)) {}  // NOLINT(google-explicit-constructor)
  static Json MakeObject() { return Json(Object{}); }
  static Json MakeArray() { return Json(Array{}); }

  // On an object: adds (or replaces) a member. On an array: appends.
  Json& Set(const std::string& key, Json value);
  Json& Push(Json value);
  bool empty() const;

  // Compact, one line.
  std::string Dump() const;

 private:
  explicit Json(Object o) : v_(std::move(o)) {}
  explicit Json(Array a) : v_(std::move(a)) {}
  void DumpTo(std::string* out) const;

  std::variant<std::monostate, bool, int64_t, uint64_t, double, std::string, Array, Object> v_;
};

}  // namespace strata::admin
