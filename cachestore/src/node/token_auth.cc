#include "node/token_auth.h"

#include "util/file_util.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <fstream>
#include <sstream>
#include <unordered_set>

#include "strata/chain_key.h"

namespace strata {

std::string HashToken(std::string_view token) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(token.data(), token.size(), digest, &len, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

Result<TokenTable> TokenTable::Load(const std::string& path) {
  Result<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    const bool missing = text.status().code() == StatusCode::kNotFound;
    return Status(text.status().code(), "cannot read tokens file " + path +
                                            (missing ? "" : ": " + text.status().message()));
  }
  Result<TokenTable> table = Parse(*text, path);
  // A node nobody can call is a mistake (an empty or wrong file), not a
  // configuration.
  if (table.ok() && table->size() == 0) {
    return InvalidArgument("tokens file " + path + " names no token");
  }
  return table;
}

Result<TokenTable> TokenTable::Parse(std::string_view text, const std::string& origin) {
  TokenTable table;
  std::istringstream lines{std::string(text)};
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    const std::string where = origin + ":" + std::to_string(n) + ": ";
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string digest, ns, role, extra;
    if (!(fields >> digest)) continue;  // blank
    if (!(fields >> ns >> role) || (fields >> extra)) {
      return InvalidArgument(where + "expected 'sha256:<hex> <namespace> <role>'");
    }
    if (digest.size() != 7 + 64 || !digest.starts_with("sha256:") ||
        digest.find_first_not_of("0123456789abcdef", 7) != std::string::npos) {
      return InvalidArgument(where + "token hash must be sha256: and 64 lowercase hex digits");
    }
    Principal p;
    p.ns = ns;
    if (role == "read") {
      p.role = Role::kRead;
    } else if (role == "write") {
      p.role = Role::kWrite;
    } else if (role == "admin") {
      p.role = Role::kAdmin;
    } else {
      return InvalidArgument(
          fmt::format("{}role must be read, write or admin, got '{}'", where, role));
    }
    if (ns == kOperatorNamespace) {
      if (p.role != Role::kAdmin) return InvalidArgument(where + "namespace '*' needs role admin");
    } else if (Status st = ValidateNamespace(ns); !st.ok()) {
      return InvalidArgument(where + st.message());
    }
    if (!table.by_hash_.emplace(digest, std::move(p)).second) {
      return InvalidArgument(where + "duplicate token hash");
    }
  }
  return table;
}

size_t TokenTable::tenant_namespaces() const {
  std::unordered_set<std::string_view> names;
  for (const auto& [hash, p] : by_hash_) {
    if (p.ns != kOperatorNamespace) names.insert(p.ns);
  }
  return names.size();
}

Result<Principal> TokenTable::Authenticate(std::string_view authorization) const {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.empty()) return Unauthenticated("missing 'authorization: Bearer' credentials");
  if (!authorization.starts_with(kBearer) || authorization.size() == kBearer.size() ||
      authorization.size() > 4096) {
    return Unauthenticated("credentials must be 'Bearer <token>'");
  }
  auto it = by_hash_.find(HashToken(authorization.substr(kBearer.size())));
  if (it == by_hash_.end()) return Unauthenticated("token not recognised");
  return it->second;
}

}  // namespace strata
