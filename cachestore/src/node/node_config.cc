#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "cluster/etcd_client.h"
#include "cluster/etcd_membership.h"
#include "dataplane/data_plane.h"
#include "node/node.h"

namespace strata {
namespace {

Result<uint64_t> ParseBytes(const std::string& text) {
  // "64GiB", "512MiB", "1048576".
  static const std::map<std::string, uint64_t> kUnits = {{"", 1},
                                                         {"B", 1},
                                                         {"KiB", 1ull << 10},
                                                         {"MiB", 1ull << 20},
                                                         {"GiB", 1ull << 30},
                                                         {"TiB", 1ull << 40}};
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || p == text.data()) return InvalidArgument("not a size: '" + text + "'");
  auto unit = kUnits.find(std::string(p, end));
  if (unit == kUnits.end()) {
    return InvalidArgument("unknown size unit in '" + text + "' (use B, KiB, MiB, GiB, TiB)");
  }
  if (value > UINT64_MAX / unit->second) return InvalidArgument("size too large: '" + text + "'");
  return value * unit->second;
}

Result<Nanos> ParseDuration(const std::string& text) {
  // "250ms", "10s", "5m", "72h".
  static const std::map<std::string, Nanos> kUnits = {
      {"ms", kNanosPerMilli}, {"s", kNanosPerSecond}, {"m", Minutes(1)}, {"h", Hours(1)}};
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, value);
  auto unit = kUnits.find(std::string(p, end));
  if (ec != std::errc() || p == text.data() || unit == kUnits.end()) {
    return InvalidArgument("not a duration: '" + text + "' (use e.g. 250ms, 10s, 5m, 72h)");
  }
  if (value > static_cast<uint64_t>(Hours(24 * 365 * 10) / unit->second)) {
    return InvalidArgument("duration too long: '" + text + "'");
  }
  return static_cast<Nanos>(value) * unit->second;
}

Result<double> ParseFraction(const std::string& text) {
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || !(v > 0 && v <= 1)) {
    return InvalidArgument("not a fraction in (0, 1]: '" + text + "'");
  }
  return v;
}

// A fraction, or "auto" (unset: the node decides).
Result<std::optional<double>> ParseFractionOrAuto(const std::string& text) {
  if (text == "auto") return std::optional<double>();
  Result<double> v = ParseFraction(text);
  if (!v.ok()) return InvalidArgument(v.status().message() + " (or auto)");
  return std::optional<double>(*v);
}

Result<uint32_t> ParseCount(const std::string& text) {
  uint32_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v == 0 || v > 1024) {
    return InvalidArgument("not a count in [1, 1024]: '" + text + "'");
  }
  return v;
}

// A positive count up to 2^40 (limits such as leased entries).
Result<uint64_t> ParseLimit(const std::string& text) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v == 0 || v > (uint64_t{1} << 40)) {
    return InvalidArgument("not a count in [1, 2^40]: '" + text + "'");
  }
  return v;
}

Result<bool> ParseBool(const std::string& text) {
  // YAML writes them in any case (True, TRUE).
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "true" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "no" || t == "off") return false;
  return InvalidArgument("not a boolean: '" + text + "' (use true or false)");
}

using Setter = std::function<Status(NodeConfig*, const std::string&)>;

template <typename T, typename Parse>
Setter Field(T NodeConfig::*member, Parse parse) {
  return [member, parse](NodeConfig* c, const std::string& v) -> Status {
    auto parsed = parse(v);
    if (!parsed.ok()) return parsed.status();
    c->*member = *parsed;
    return Status::Ok();
  };
}

Setter Text(std::string NodeConfig::*member) {
  return [member](NodeConfig* c, const std::string& v) {
    c->*member = v;
    return Status::Ok();
  };
}

// Every key a config may hold, YAML and --set alike.
const std::map<std::string, Setter>& Setters() {
  static const std::map<std::string, Setter> kSetters = {
      {"node_id", Text(&NodeConfig::node_id)},
      {"listen", Text(&NodeConfig::listen)},
      {"http_listen", Text(&NodeConfig::http_listen)},
      {"dram_bytes", Field(&NodeConfig::dram_bytes, ParseBytes)},
      {"high_watermark", Field(&NodeConfig::high_watermark, ParseFraction)},
      {"low_watermark", Field(&NodeConfig::low_watermark, ParseFraction)},
      {"global_kv_ttl", Field(&NodeConfig::global_kv_ttl, ParseDuration)},
      {"swa_ttl", Field(&NodeConfig::swa_ttl, ParseDuration)},
      {"read_lease_ttl", Field(&NodeConfig::read_lease_ttl, ParseDuration)},
      {"write_lease_ttl", Field(&NodeConfig::write_lease_ttl, ParseDuration)},
      {"max_lease_life", Field(&NodeConfig::max_lease_life, ParseDuration)},
      {"max_leased_entries_per_namespace",
       Field(&NodeConfig::max_leased_entries_per_namespace, ParseLimit)},
      {"max_held_share_per_namespace",
       Field(&NodeConfig::max_held_share_per_namespace, ParseFractionOrAuto)},
      {"committed_share_per_namespace",
       Field(&NodeConfig::committed_share_per_namespace, ParseFractionOrAuto)},
      {"eviction_policy", Text(&NodeConfig::eviction_policy)},
      {"extra_layouts", Field(&NodeConfig::extra_layouts, ParseLayoutSpecs)},
      {"ssd_dir", Text(&NodeConfig::ssd_dir)},
      {"ssd_index_dir", Text(&NodeConfig::ssd_index_dir)},
      {"ssd_bytes", Field(&NodeConfig::ssd_bytes, ParseBytes)},
      {"ssd_data_files", Field(&NodeConfig::ssd_data_files, ParseCount)},
      {"ssd_sync", Field(&NodeConfig::ssd_sync, ParseBool)},
      {"ssd_admission", Text(&NodeConfig::ssd_admission)},
      {"ssd_eviction_policy", Text(&NodeConfig::ssd_eviction_policy)},
      {"tokens_file", Text(&NodeConfig::tokens_file)},
      {"tls_cert_file", Text(&NodeConfig::tls_cert_file)},
      {"tls_key_file", Text(&NodeConfig::tls_key_file)},
      {"data_plane_mode", Text(&NodeConfig::data_plane_mode)},
      {"shutdown_grace", Field(&NodeConfig::shutdown_grace, ParseDuration)},
      {"log_format", Text(&NodeConfig::log_format)},
      {"log_level", Text(&NodeConfig::log_level)},
      // The `cluster:` section (YAML) is flattened to cluster.<key>.
      {"cluster.etcd_endpoints",
       [](NodeConfig* c, const std::string& v) {
         c->cluster.etcd_endpoints = v;
         return Status::Ok();
       }},
      {"cluster.name",
       [](NodeConfig* c, const std::string& v) {
         c->cluster.name = v;
         return Status::Ok();
       }},
      {"cluster.advertise",
       [](NodeConfig* c, const std::string& v) {
         c->cluster.advertise = v;
         return Status::Ok();
       }},
      {"cluster.lease_ttl",
       [](NodeConfig* c, const std::string& v) -> Status {
         Result<Nanos> d = ParseDuration(v);
         if (!d.ok()) return d.status();
         c->cluster.lease_ttl = *d;
         return Status::Ok();
       }},
  };
  return kSetters;
}

Status Set(NodeConfig* config, const std::string& key, const std::string& value) {
  auto it = Setters().find(key);
  if (it == Setters().end()) return InvalidArgument("unknown config key '" + key + "'");
  Status st = it->second(config, value);
  if (!st.ok()) return InvalidArgument(key + ": " + st.message());
  return Status::Ok();
}

}  // namespace

Result<NodeConfig> LoadNodeConfig(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {  // yaml-cpp reports by exception; stop it here
    return InvalidArgument("config " + path + ": " + e.what());
  }
  NodeConfig config;
  if (root.IsNull()) return config;
  if (!root.IsMap()) return InvalidArgument("config " + path + ": expected a mapping of keys");
  // yaml-cpp keeps the last of two equal keys: a key given twice is
  // refused rather than one of its values silently dropped.
  std::set<std::string> seen;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>("");
    if (!seen.insert(key).second) {
      return InvalidArgument(fmt::format("config {}: '{}' is given twice", path, key));
    }
    // A key left empty (`tls_cert_file:`, or `cluster:` with its keys
    // commented out) is YAML's null: the empty value, or an empty section.
    if (key == "cluster" && (kv.second.IsMap() || kv.second.IsNull())) {
      for (const auto& sub : kv.second) {
        const std::string sub_key = "cluster." + sub.first.as<std::string>("");
        if (!seen.insert(sub_key).second) {
          return InvalidArgument(fmt::format("config {}: '{}' is given twice", path, sub_key));
        }
        if (!sub.second.IsScalar() && !sub.second.IsNull()) {
          return InvalidArgument(
              fmt::format("config {}: '{}' must be a single value", path, sub_key));
        }
        Status st = Set(&config, sub_key, sub.second.IsNull() ? "" : sub.second.Scalar());
        if (!st.ok()) return InvalidArgument("config " + path + ": " + st.message());
      }
      continue;
    }
    std::string value;
    if (key == "extra_layouts" && (kv.second.IsSequence() || kv.second.IsNull())) {
      // A list of layout specs: the same as one string joined by ';'.
      size_t i = 0;
      for (const auto& item : kv.second) {
        if (!item.IsScalar() || item.Scalar().empty() ||
            item.Scalar().find(';') != std::string::npos) {
          return InvalidArgument(fmt::format(
              "config {}: {}[{}] must be one layout spec, <id>:<kind>:<block_tokens>:<groups>",
              path, key, i));
        }
        value += (i++ == 0 ? "" : ";") + item.Scalar();
      }
    } else if (kv.second.IsScalar()) {
      value = kv.second.Scalar();
    } else if (!kv.second.IsNull()) {
      return InvalidArgument(fmt::format("config {}: '{}' must be a single value", path, key));
    }
    Status st = Set(&config, key, value);
    if (!st.ok()) return InvalidArgument("config " + path + ": " + st.message());
  }
  // Files named in a config are relative to the config's own directory.
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (std::string* file : {&config.tokens_file, &config.tls_cert_file, &config.tls_key_file,
                            &config.ssd_dir, &config.ssd_index_dir}) {
    if (!file->empty() && std::filesystem::path(*file).is_relative()) {
      *file = (dir / *file).lexically_normal().string();
    }
  }
  return config;
}

Status ApplyNodeConfigOverride(NodeConfig* config, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgument("override must be key=value, got '" + assignment + "'");
  }
  return Set(config, assignment.substr(0, eq), assignment.substr(eq + 1));
}

Status ValidateNodeConfig(const NodeConfig& c) {
  if (c.listen.empty()) return InvalidArgument("listen must name host:port");
  if (c.tokens_file.empty()) {
    return InvalidArgument("tokens_file is required: a node never serves unauthenticated callers");
  }
  // The id goes into every log line and the cluster's records: one line,
  // printable, no spaces.
  if (c.node_id.size() > 255 ||
      std::any_of(c.node_id.begin(), c.node_id.end(),
                  [](unsigned char ch) { return ch <= ' ' || ch >= 0x7f; })) {
    return InvalidArgument(
        "node_id must be at most 255 printable characters without spaces or control characters");
  }
  if (c.tls_cert_file.empty() != c.tls_key_file.empty()) {
    return InvalidArgument("tls_cert_file and tls_key_file go together");
  }
  // Equal watermarks are allowed: both at 1 evict on demand only.
  if (c.low_watermark > c.high_watermark) {
    return InvalidArgument("low_watermark must not be above high_watermark");
  }
  for (const Layout& l : c.extra_layouts) {
    if (l.id == kV41GlobalKvLayoutId || l.id == kV41SwaLayoutId) {
      return InvalidArgument("extra_layouts: id " + std::to_string(l.id) +
                             " is reserved for a built-in layout");
    }
  }
  if (!dataplane::ParseMode(c.data_plane_mode).ok()) {
    return InvalidArgument("data_plane_mode must be auto, rma or am");
  }
  if (c.log_format != "text" && c.log_format != "json") {
    return InvalidArgument("log_format must be text or json");
  }
  // spdlog takes any other name for "off": a typo would silence the node.
  static constexpr std::array<std::string_view, 9> kLogLevels = {
      "trace", "debug", "info", "warn", "warning", "err", "error", "critical", "off"};
  if (std::find(kLogLevels.begin(), kLogLevels.end(), c.log_level) == kLogLevels.end()) {
    return InvalidArgument(
        "log_level must be trace, debug, info, warn, error, critical or off, got '" + c.log_level +
        "'");
  }
  if (c.read_lease_ttl <= 0 || c.read_lease_ttl > kMaxLeaseTtl || c.write_lease_ttl <= 0 ||
      c.write_lease_ttl > kMaxLeaseTtl) {
    return InvalidArgument("lease TTLs must be in (0, 10m]");
  }
  if (c.max_lease_life < kMaxLeaseTtl) {
    return InvalidArgument("max_lease_life must be at least 10m (the longest lease TTL)");
  }
  if (c.ssd_admission != "all" && c.ssd_admission != "hit_once") {
    return InvalidArgument("ssd_admission must be all or hit_once");
  }
  if (c.ssd_eviction_policy != "lru" && c.ssd_eviction_policy != "deadline") {
    return InvalidArgument("ssd_eviction_policy must be lru or deadline");
  }
  if (!c.ssd_dir.empty() && c.ssd_bytes < (64ull << 20)) {
    return InvalidArgument("ssd_bytes must be at least 64MiB");
  }
  if (!c.cluster.etcd_endpoints.empty()) {
    if (Result<std::vector<std::string>> e = cluster::ParseEtcdEndpoints(c.cluster.etcd_endpoints);
        !e.ok()) {
      return InvalidArgument("cluster.etcd_endpoints: " + e.status().message());
    }
    STRATA_RETURN_IF_ERROR(cluster::ValidateKeySegment("cluster.name", c.cluster.name));
    if (c.cluster.lease_ttl < Seconds(1) || c.cluster.lease_ttl > Minutes(10)) {
      return InvalidArgument("cluster.lease_ttl must be in [1s, 10m]");
    }
  }
  return Status::Ok();
}

}  // namespace strata
