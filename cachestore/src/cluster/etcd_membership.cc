#include "cluster/etcd_membership.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <thread>

#include "cluster/etcd_client.h"
#include "strata/v1/cluster.pb.h"
#include "util/mutex.h"

namespace strata {
namespace cluster {

Status ValidateKeySegment(std::string_view what, std::string_view segment) {
  if (segment.empty()) return InvalidArgument(std::string(what) + " is empty");
  if (segment.size() > 200) return InvalidArgument(std::string(what) + " is over 200 bytes");
  for (char c : segment) {
    if (c == '/' || c <= ' ' || c > '~') {
      return InvalidArgument(std::string(what) + " '" + std::string(segment) +
                             "' may hold printable ASCII other than '/' and space only");
    }
  }
  return Status::Ok();
}

std::string ClusterPrefix(std::string_view cluster) {
  return "/strata/" + std::string(cluster) + "/";
}
std::string NodesPrefix(std::string_view cluster) { return ClusterPrefix(cluster) + "nodes/"; }
std::string NodeKey(std::string_view cluster, std::string_view node_id) {
  return NodesPrefix(cluster) + std::string(node_id);
}
std::string SettingKey(std::string_view cluster, std::string_view name) {
  return ClusterPrefix(cluster) + "settings/" + std::string(name);
}

std::string EncodeNodeRecord(const NodeRecord& record) {
  v1::NodeRecord pb;
  pb.set_node_id(record.info.node_id);
  pb.set_address(record.info.address);
  pb.set_draining(record.info.draining);
  pb.set_data_plane_host(record.data_plane_host);
  pb.set_capacity_bytes(record.capacity_bytes);
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // A message with only scalar fields always prints.
  (void)google::protobuf::util::MessageToJsonString(pb, &out, options);
  return out;
}

Result<NodeRecord> DecodeNodeRecord(std::string_view json) {
  v1::NodeRecord pb;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // newer nodes may add fields
  const auto st = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &pb, options);
  if (!st.ok()) return InvalidArgument("node record: " + std::string(st.message()));
  if (pb.address().empty()) return InvalidArgument("node record without an address");
  NodeRecord r;
  r.info.node_id = pb.node_id();
  r.info.address = pb.address();
  r.info.draining = pb.draining();
  r.data_plane_host = pb.data_plane_host();
  r.capacity_bytes = pb.capacity_bytes();
  return r;
}

namespace {

// A positive decimal setting; nullopt (logged) when it does not parse.
// A positive decimal; surrounding whitespace is allowed (`echo 2 | etcdctl
// put KEY` stores "2\n").
std::optional<uint32_t> ParseSetting(std::string_view value) {
  const size_t first = value.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return std::nullopt;
  value = value.substr(first, value.find_last_not_of(" \t\r\n") - first + 1);
  uint32_t v = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || ptr != end || v == 0) return std::nullopt;
  return v;
}

class EtcdMembership final : public Membership {
 public:
  explicit EtcdMembership(std::string cluster) : cluster_(std::move(cluster)) {}

  // Lists once (so an unreachable etcd is reported to the opener), then
  // keeps the state current from the watch.
  Status Start(std::unique_ptr<EtcdClient> client) {
    client_ = std::move(client);
    Result<EtcdRange> first = client_->GetPrefix(ClusterPrefix(cluster_));
    if (!first.ok()) return first.status();
    Reset(*first);
    EtcdWatchHandler handler;
    handler.on_reset = [this](const EtcdRange& r) { Reset(r); };
    handler.on_events = [this](const std::vector<EtcdEvent>& events) { Apply(events); };
    handler.on_error = [this](const Status& st) {
      spdlog::warn("event=etcd_membership_watch_broken cluster={} error=\"{}\"", cluster_,
                   st.ToString());
    };
    watch_ = client_->WatchPrefix(ClusterPrefix(cluster_), std::move(handler));
    return Status::Ok();
  }

  ~EtcdMembership() override { watch_.reset(); }

  std::vector<NodeInfo> Nodes() const override {
    MutexLock lock(mu_);
    return nodes_;
  }
  ClusterSettings Settings() const override {
    MutexLock lock(mu_);
    return settings_;
  }

  uint64_t Subscribe(Listener listener) override {
    MutexLock lock(listeners_mu_);
    const uint64_t id = ++next_listener_;
    listeners_.emplace(id, std::move(listener));
    return id;
  }

  void Unsubscribe(uint64_t id) override {
    {
      MutexLock lock(listeners_mu_);
      listeners_.erase(id);
    }
    // Wait out a notification in progress, unless this is that
    // notification's own thread (a listener that unsubscribes itself).
    if (notifying_thread_.load() != std::this_thread::get_id()) {
      MutexLock wait(notify_mu_);
    }
  }

 private:
  // Keys under the cluster prefix -> values; the state is derived from it.
  void Reset(const EtcdRange& range) {
    std::map<std::string, std::string> kvs;
    for (const EtcdKeyValue& kv : range.kvs) kvs[kv.key] = kv.value;
    {
      MutexLock lock(mu_);
      kvs_ = std::move(kvs);
    }
    Rebuild();
  }

  void Apply(const std::vector<EtcdEvent>& events) {
    {
      MutexLock lock(mu_);
      for (const EtcdEvent& e : events) {
        if (e.type == EtcdEvent::Type::kPut) {
          kvs_[e.kv.key] = e.kv.value;
        } else {
          kvs_.erase(e.kv.key);
        }
      }
    }
    Rebuild();
  }

  void Rebuild() {
    const std::string nodes_prefix = NodesPrefix(cluster_);
    const std::string rf_key = SettingKey(cluster_, kReplicationFactorSetting);
    const std::string bt_key = SettingKey(cluster_, kBlockTokensSetting);
    std::vector<NodeInfo> nodes;
    ClusterSettings settings;
    bool changed = false;
    {
      MutexLock lock(mu_);
      for (const auto& [key, value] : kvs_) {
        if (key.starts_with(nodes_prefix)) {
          const std::string id = key.substr(nodes_prefix.size());
          Result<NodeRecord> r = DecodeNodeRecord(value);
          if (!r.ok() || !ValidateKeySegment("node id", id).ok()) {
            WarnOnceLocked(key, value, r.ok() ? "bad node id" : r.status().ToString());
            continue;
          }
          r->info.node_id = id;  // the key is authoritative
          nodes.push_back(r->info);
        } else if (key == rf_key || key == bt_key) {
          const std::optional<uint32_t> v = ParseSetting(value);
          if (!v.has_value()) {
            WarnOnceLocked(key, value, "not a positive integer");
          } else {
            (key == rf_key ? settings.replication_factor : settings.block_tokens) = *v;
          }
        }
      }
      // kvs_ is a sorted map: nodes come out sorted by node_id.
      changed = nodes != nodes_ || settings != settings_;
      nodes_ = nodes;
      settings_ = settings;
    }
    if (changed) Notify(nodes);
  }

  // A bad value is logged once, not at every event or reconnect.
  void WarnOnceLocked(const std::string& key, const std::string& value, const std::string& why) {
    if (warned_.size() > 1024) warned_.clear();
    if (warned_.insert(key + '\0' + value).second) {
      spdlog::warn("event=etcd_value_ignored key={} error=\"{}\"", key, why);
    }
  }

  void Notify(const std::vector<NodeInfo>& nodes) {
    MutexLock hold(notify_mu_);
    notifying_thread_.store(std::this_thread::get_id());
    std::vector<uint64_t> ids;
    {
      MutexLock lock(listeners_mu_);
      for (const auto& [id, fn] : listeners_) ids.push_back(id);
    }
    for (uint64_t id : ids) {
      Listener fn;
      {
        MutexLock lock(listeners_mu_);
        auto it = listeners_.find(id);
        if (it == listeners_.end()) continue;  // unsubscribed meanwhile
        fn = it->second;
      }
      fn(nodes);
    }
    notifying_thread_.store(std::thread::id());
  }

  const std::string cluster_;
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<EtcdWatch> watch_;

  mutable Mutex mu_;
  std::map<std::string, std::string> kvs_;
  std::vector<NodeInfo> nodes_;
  ClusterSettings settings_;
  std::set<std::string> warned_;  // bad values already logged

  Mutex listeners_mu_;
  std::map<uint64_t, Listener> listeners_;
  uint64_t next_listener_ = 0;
  Mutex notify_mu_;  // held while listeners run
  std::atomic<std::thread::id> notifying_thread_{};
};

}  // namespace
}  // namespace cluster

Result<std::unique_ptr<Membership>> OpenEtcdMembership(const EtcdMembershipOptions& options) {
  STRATA_RETURN_IF_ERROR(cluster::ValidateKeySegment("cluster name", options.cluster));
  cluster::EtcdClientOptions client_options;
  client_options.endpoints = options.endpoints;
  client_options.call_timeout = std::chrono::milliseconds(options.call_timeout_ms);
  Result<std::unique_ptr<cluster::EtcdClient>> client = cluster::EtcdClient::Open(client_options);
  if (!client.ok()) return client.status();
  // Before the watch thread exists (see node_registration.cc on spdlog).
  spdlog::debug("event=etcd_membership_opening cluster={}", options.cluster);
  auto m = std::make_unique<cluster::EtcdMembership>(options.cluster);
  STRATA_RETURN_IF_ERROR(m->Start(std::move(client).value()));
  return std::unique_ptr<Membership>(std::move(m));
}

}  // namespace strata
