// Bearer-token authentication (DESIGN §7): a file maps the SHA-256 of each
// token to a namespace and a role. Only hashes are stored, so the file is
// not a secret; a token is never logged.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "strata/status.h"
#include "strata/store_types.h"

namespace strata {

// The namespace of operator tokens: admin calls may name any namespace.
inline constexpr std::string_view kOperatorNamespace = "*";

// "sha256:" + lowercase hex, the form the tokens file holds.
std::string HashToken(std::string_view token);

class TokenTable {
 public:
  // Lines: "sha256:<64 hex> <namespace> <read|write|admin>"; '#' comments
  // and blank lines are skipped. Any malformed line fails the whole load.
  static Result<TokenTable> Load(const std::string& path);
  static Result<TokenTable> Parse(std::string_view text, const std::string& origin);

  // From the "authorization" header value ("Bearer <token>").
  Result<Principal> Authenticate(std::string_view authorization) const;
  size_t size() const { return by_hash_.size(); }
  // Distinct namespaces of the tokens, the operator's '*' not counted.
  size_t tenant_namespaces() const;

 private:
  std::unordered_map<std::string, Principal> by_hash_;
};

}  // namespace strata
