#include "commands.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace strata::admin {

void PrintJsonError(const std::string& code, ExitCode exit_code, const std::string& message) {
  Json error = Json::MakeObject();
  error.Set("code", code).Set("exit_code", static_cast<int>(exit_code)).Set("message", message);
  std::printf("%s\n", Json::MakeObject().Set("error", std::move(error)).Dump().c_str());
}

int Context::Fail(const Status& status) const {
  const ExitCode code = ExitCodeFor(status.code());
  std::fprintf(stderr, "strata-admin: %s\n", status.message().c_str());
  if (json) PrintJsonError(std::string(StatusCodeName(status.code())), code, status.message());
  return static_cast<int>(code);
}

int ReportNodeFailures(const Context& ctx, const std::vector<NodeFailure>& failed, Json* out) {
  if (failed.empty()) return 0;
  Json errors = Json::MakeArray();
  for (const NodeFailure& f : failed) {
    const std::string& address = ctx.clients[f.node]->address();
    std::fprintf(stderr, "strata-admin: node %s: %s\n", address.c_str(),
                 f.status.message().c_str());
    errors.Push(Json::MakeObject()
                    .Set("node", address)
                    .Set("code", std::string(StatusCodeName(f.status.code())))
                    .Set("message", f.status.message()));
  }
  if (ctx.json) out->Set("errors", std::move(errors));
  return static_cast<int>(ExitCodeFor(failed.front().status.code()));
}

Result<NodeClient*> Context::FindNode(const std::string& node_ref) {
  for (const auto& c : clients) {
    if (c->address() == node_ref || "strata://" + c->address() == node_ref) return c.get();
  }
  // By id: ask each node; one that does not answer is not the one named.
  std::string known;
  Status unreachable;
  for (const auto& c : clients) {
    Result<v1::StatsResponse> st = c->Stats();
    if (!st.ok()) {
      if (unreachable.ok()) unreachable = st.status();
      known += (known.empty() ? "" : ", ") + std::string("? (") + c->address() + ")";
      continue;
    }
    if (st->node_id() == node_ref) return c.get();
    known += (known.empty() ? "" : ", ") + st->node_id() + " (" + c->address() + ")";
  }
  // It may be the node that did not answer: say so, with that error's code.
  if (!unreachable.ok()) {
    return Status(unreachable.code(), "no node '" + node_ref + "' among those that answered (" +
                                          known + "); " + unreachable.message());
  }
  return NotFound("no node '" + node_ref + "' in --store; nodes: " + known);
}

CLI::Validator Finite() {
  return {[](std::string& text) {
            return std::isfinite(std::strtod(text.c_str(), nullptr))
                       ? std::string()
                       : "'" + text + "' is not a finite number";
          },
          ""};
}

Result<v1::StateKind> ParseKind(const std::string& text) {
  if (text == "global" || text == "global_kv" || text == "GLOBAL_KV") return v1::GLOBAL_KV;
  if (text == "swa" || text == "swa_state" || text == "SWA_STATE") return v1::SWA_STATE;
  return InvalidArgument("--kind: '" + text + "' is not global or swa");
}

std::string KindName(v1::StateKind kind) {
  switch (kind) {
    case v1::GLOBAL_KV:
      return "global";
    case v1::SWA_STATE:
      return "swa";
    default:
      return "unknown";
  }
}

std::string TierName(v1::Tier tier) {
  switch (tier) {
    case v1::HBM:
      return "hbm";
    case v1::DRAM:
      return "dram";
    case v1::SSD:
      return "ssd";
    default:
      return "-";
  }
}

Result<std::string> ParseKeyHex(const std::string& hex) {
  std::optional<ChainKey> key = ChainKey::FromHex(hex);
  if (!key.has_value()) {
    return InvalidArgument("'" + hex + "' is not a chain key (32 hex digits, as ls prints)");
  }
  return std::string(reinterpret_cast<const char*>(key->bytes.data()), key->bytes.size());
}

std::string Hex(const std::string& bytes) {
  static const char* const kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Result<uint64_t> ParseDuration(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string unit = text.substr(digits);
  uint64_t scale = 0;
  if (unit.empty() || unit == "s") {
    scale = 1;
  } else if (unit == "m") {
    scale = 60;
  } else if (unit == "h") {
    scale = 3600;
  } else if (unit == "d") {
    scale = 86400;
  }
  if (digits == 0 || digits > 12 || scale == 0) {
    return InvalidArgument("'" + text + "' is not a duration (e.g. 90, 90s, 15m, 2h, 3d)");
  }
  return std::stoull(text.substr(0, digits)) * scale;
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Json EntryJson(const v1::EntryInfo& e) {
  Json j = Json::MakeObject();
  j.Set("key", Hex(e.key()))
      .Set("kind", KindName(e.kind()))
      .Set("namespace", e.namespace_())
      .Set("model_id", Hex(e.model_id()))
      .Set("layout_id", e.layout_id())
      .Set("payload_bytes", e.payload_bytes())
      .Set("checksum", Hex64(e.checksum()))
      .Set("tier", TierName(e.tier()))
      .Set("age_ms", e.age_ms())
      .Set("expires_in_ms", e.expires_in_ms())
      .Set("pinned", e.pinned_for_ms() > 0)
      .Set("pinned_for_ms", e.pinned_for_ms())
      .Set("live_leases", e.live_leases())
      .Set("hits", e.hits())
      .Set("has_parent", e.has_parent())
      .Set("children", e.children());
  return j;
}

}  // namespace strata::admin
