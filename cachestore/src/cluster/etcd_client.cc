#include "cluster/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "etcd/etcdserverpb/rpc.grpc.pb.h"
#include "util/mutex.h"

namespace strata::cluster {
namespace {

namespace pb = ::etcdserverpb;

// gRPC's default reconnect backoff grows to two minutes; an etcd that comes
// back must be found again within a lease TTL.
constexpr int kReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 1000;
// gRPC also uses the "min reconnect backoff" as the time a connection
// attempt (TCP + HTTP/2 handshake) may take; etcd's first answer on a fresh
// connection can take longer than 100 ms.
constexpr int kMinConnectTimeoutMs = 2000;
constexpr std::chrono::milliseconds kReplaceFailingChannelAfter{3000};
// HTTP/2 pings on open streams (the watch), so a peer that vanished without
// closing the connection is noticed. etcd refuses pings more often than its
// --grpc-keepalive-min-time (5 s by default).
constexpr int kKeepAliveTimeMs = 6000;
constexpr int kKeepAliveTimeoutMs = 2000;

// One connection to one etcd endpoint: a channel and its stubs.
struct Endpoint {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;
};

std::shared_ptr<Endpoint> Connect(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinConnectTimeoutMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepAliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepAliveTimeoutMs);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Our own connections, so replacing a stuck channel really reconnects.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // A listing holds every key under a prefix, each up to etcd's 1.5 MiB:
  // gRPC's 4 MiB default would fail it (etcd's own client allows 2 GiB).
  args.SetMaxReceiveMessageSize(std::numeric_limits<int>::max());
  auto ep = std::make_shared<Endpoint>();
  ep->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  ep->kv = pb::KV::NewStub(ep->channel);
  ep->lease = pb::Lease::NewStub(ep->channel);
  ep->watch = pb::Watch::NewStub(ep->channel);
  return ep;
}

// An endpoint's current connection. A channel that has failed for a while
// is replaced: gRPC 1.51 was seen to keep answering "connection refused"
// from a channel whose etcd had long come back after a restart.
class EndpointSlot {
 public:
  explicit EndpointSlot(std::string target) : target_(std::move(target)), conn_(Connect(target_)) {}

  std::shared_ptr<Endpoint> Get() {
    MutexLock lock(mu_);
    return conn_;
  }
  void Answered() {
    MutexLock lock(mu_);
    failing_since_.reset();
  }
  void Failed() {
    const auto now = std::chrono::steady_clock::now();
    MutexLock lock(mu_);
    if (!failing_since_) {
      failing_since_ = now;
    } else if (now - *failing_since_ > kReplaceFailingChannelAfter) {
      conn_ = Connect(target_);
      failing_since_ = now;
    }
  }

 private:
  const std::string target_;  // host:port
  Mutex mu_;
  std::shared_ptr<Endpoint> conn_;
  std::optional<std::chrono::steady_clock::time_point> failing_since_;
};

// Connection trouble: worth trying the next endpoint.
bool Retriable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

Status FromEtcd(const std::string& what, const grpc::Status& s) {
  const std::string m = "etcd " + what + ": " + s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return Unavailable(m);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return DeadlineExceeded(m);
    case grpc::StatusCode::NOT_FOUND:
      return NotFound(m);
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return InvalidArgument(m);
    case grpc::StatusCode::PERMISSION_DENIED:
      return PermissionDenied(m);
    case grpc::StatusCode::UNAUTHENTICATED:
      return Unauthenticated(m);
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return ResourceExhausted(m);
    default:
      return Internal(m);
  }
}

EtcdKeyValue FromPb(const ::mvccpb::KeyValue& kv) {
  EtcdKeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.lease = kv.lease();
  return out;
}

std::string Trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\n");
  if (first == std::string_view::npos) return "";
  const auto last = s.find_last_not_of(" \t\n");
  return std::string(s.substr(first, last - first + 1));
}

}  // namespace

std::string PrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    std::string e = Trim(list.substr(start, comma - start));
    start = comma + 1;
    if (e.empty()) continue;
    if (e.starts_with("https://")) {
      return InvalidArgument("etcd endpoint '" + e +
                             "': TLS to etcd is not supported; use http://");
    }
    if (e.starts_with("http://")) e = e.substr(7);
    while (!e.empty() && e.back() == '/') e.pop_back();
    const auto colon = e.rfind(':');
    const std::string port = colon == std::string::npos ? "" : e.substr(colon + 1);
    if (colon == 0 || port.empty() ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        port.size() > 5 || std::stoi(port) == 0 || std::stoi(port) > 65535) {
      return InvalidArgument("etcd endpoint '" + e + "' is not host:port");
    }
    out.push_back("http://" + e);
  }
  if (out.empty()) return InvalidArgument("no etcd endpoint given");
  return out;
}

struct EtcdClient::Impl {
  EtcdClientOptions options;
  std::vector<std::unique_ptr<EndpointSlot>> endpoints;
  std::atomic<size_t> preferred{0};  // the endpoint that last answered

  // Runs `fn(endpoint, context)` against the endpoints in turn, starting
  // with the preferred one, until one answers or the call's deadline
  // passes. With several endpoints each try gets a share of the deadline,
  // so one that hangs cannot use it all; a connection that fails fast (etcd
  // restarting) is tried again after a short pause. The call's deadline is
  // on the steady clock: a wall clock stepped back must not stretch it (gRPC
  // takes each try's deadline on the wall clock, from now).
  template <typename Fn>
  Status Call(const std::string& what, Fn fn) {
    using std::chrono::steady_clock;
    const steady_clock::time_point deadline = steady_clock::now() + options.call_timeout;
    const size_t n = endpoints.size();
    const auto share = std::max<std::chrono::milliseconds>(
        options.call_timeout / static_cast<int>(n), std::chrono::milliseconds(250));
    grpc::Status last;
    size_t idx = preferred.load() % n;
    for (size_t attempt = 0;; ++attempt, idx = (idx + 1) % n) {
      if (attempt > 0 && attempt % n == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      const steady_clock::time_point now = steady_clock::now();
      if (now >= deadline) break;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::min<steady_clock::duration>(deadline - now, share));
      std::shared_ptr<Endpoint> conn = endpoints[idx]->Get();
      last = fn(*conn, &ctx);
      if (last.ok() || !Retriable(last)) endpoints[idx]->Answered();
      if (last.ok()) {
        preferred.store(idx);
        return Status::Ok();
      }
      if (!Retriable(last)) return FromEtcd(what, last);
      endpoints[idx]->Failed();
    }
    if (n > 1) {
      return FromEtcd(what + " (no endpoint of " + std::to_string(n) + " answered)", last);
    }
    return FromEtcd(what, last);
  }
};

EtcdClient::EtcdClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

Result<std::unique_ptr<EtcdClient>> EtcdClient::Open(const EtcdClientOptions& options) {
  std::vector<std::string> endpoints;
  for (const std::string& e : options.endpoints) {
    Result<std::vector<std::string>> parsed = ParseEtcdEndpoints(e);
    if (!parsed.ok()) return parsed.status();
    endpoints.insert(endpoints.end(), parsed->begin(), parsed->end());
  }
  if (endpoints.empty()) return InvalidArgument("no etcd endpoint given");
  if (options.call_timeout <= std::chrono::milliseconds(0)) {
    return InvalidArgument("etcd call timeout must be positive");
  }
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->options.endpoints = endpoints;
  for (const std::string& e : endpoints) {
    impl->endpoints.push_back(
        std::make_unique<EndpointSlot>(e.substr(std::string_view("http://").size())));
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

const EtcdClientOptions& EtcdClient::options() const { return impl_->options; }

Status EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  if (key.empty()) return InvalidArgument("etcd put: empty key");
  pb::PutRequest req;
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  req.set_lease(lease);
  pb::PutResponse resp;
  Status st = impl_->Call("put " + std::string(key), [&](Endpoint& e, grpc::ClientContext* ctx) {
    return e.kv->Put(ctx, req, &resp);
  });
  // etcd answers NOT_FOUND for a put under a lease it does not know.
  if (st.code() == StatusCode::kNotFound && lease != 0) return LeaseExpired(st.message());
  return st;
}

Result<std::optional<EtcdKeyValue>> EtcdClient::PutIfAbsent(std::string_view key,
                                                            std::string_view value, int64_t lease) {
  if (key.empty()) return InvalidArgument("etcd put: empty key");
  pb::TxnRequest req;
  pb::Compare* absent = req.add_compare();
  absent->set_key(std::string(key));
  absent->set_target(pb::Compare::VERSION);
  absent->set_result(pb::Compare::EQUAL);
  absent->set_version(0);
  pb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  req.add_failure()->mutable_request_range()->set_key(std::string(key));
  pb::TxnResponse resp;
  Status st = impl_->Call(
      "put-if-absent " + std::string(key),
      [&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Txn(ctx, req, &resp); });
  if (st.code() == StatusCode::kNotFound && lease != 0) return LeaseExpired(st.message());
  if (!st.ok()) return st;
  if (resp.succeeded()) return std::optional<EtcdKeyValue>();
  if (resp.responses_size() != 1 || resp.responses(0).response_range().kvs().empty()) {
    return Internal("etcd put-if-absent " + std::string(key) +
                    ": the key exists, yet reading it returned nothing");
  }
  return std::optional<EtcdKeyValue>(FromPb(resp.responses(0).response_range().kvs(0)));
}

Result<EtcdKeyValue> EtcdClient::Get(std::string_view key) {
  if (key.empty()) return InvalidArgument("etcd get: empty key");
  pb::RangeRequest req;
  req.set_key(std::string(key));
  pb::RangeResponse resp;
  STRATA_RETURN_IF_ERROR(impl_->Call(
      "get " + std::string(key),
      [&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Range(ctx, req, &resp); }));
  if (resp.kvs().empty()) return NotFound("etcd: no key " + std::string(key));
  return FromPb(resp.kvs(0));
}

namespace {
Result<EtcdRange> ListPrefix(EtcdClient::Impl& impl, std::string_view prefix) {
  pb::RangeRequest req;
  req.set_key(std::string(prefix));
  req.set_range_end(PrefixRangeEnd(prefix));
  req.set_sort_order(pb::RangeRequest::ASCEND);
  req.set_sort_target(pb::RangeRequest::KEY);
  pb::RangeResponse resp;
  STRATA_RETURN_IF_ERROR(impl.Call(
      "list " + std::string(prefix),
      [&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Range(ctx, req, &resp); }));
  EtcdRange out;
  out.revision = resp.header().revision();
  out.kvs.reserve(resp.kvs_size());
  for (const auto& kv : resp.kvs()) out.kvs.push_back(FromPb(kv));
  return out;
}
}  // namespace

Result<EtcdRange> EtcdClient::GetPrefix(std::string_view prefix) {
  if (prefix.empty()) return InvalidArgument("etcd get: empty prefix");
  return ListPrefix(*impl_, prefix);
}

namespace {
Result<int64_t> DeleteRange(EtcdClient::Impl& impl, pb::DeleteRangeRequest req) {
  pb::DeleteRangeResponse resp;
  STRATA_RETURN_IF_ERROR(impl.Call(
      "delete " + req.key(),
      [&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->DeleteRange(ctx, req, &resp); }));
  return resp.deleted();
}
}  // namespace

Result<int64_t> EtcdClient::Delete(std::string_view key) {
  if (key.empty()) return InvalidArgument("etcd delete: empty key");
  pb::DeleteRangeRequest req;
  req.set_key(std::string(key));
  return DeleteRange(*impl_, std::move(req));
}

Result<int64_t> EtcdClient::DeletePrefix(std::string_view prefix) {
  if (prefix.empty()) return InvalidArgument("etcd delete: empty prefix");
  pb::DeleteRangeRequest req;
  req.set_key(std::string(prefix));
  req.set_range_end(PrefixRangeEnd(prefix));
  return DeleteRange(*impl_, std::move(req));
}

Status EtcdClient::Compact(int64_t revision) {
  pb::CompactionRequest req;
  req.set_revision(revision);
  req.set_physical(true);
  pb::CompactionResponse resp;
  return impl_->Call("compact", [&](Endpoint& e, grpc::ClientContext* ctx) {
    return e.kv->Compact(ctx, req, &resp);
  });
}

Result<EtcdLease> EtcdClient::LeaseGrant(int64_t ttl_seconds) {
  if (ttl_seconds <= 0) return InvalidArgument("etcd lease TTL must be positive");
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_seconds);
  pb::LeaseGrantResponse resp;
  STRATA_RETURN_IF_ERROR(impl_->Call("lease grant", [&](Endpoint& e, grpc::ClientContext* ctx) {
    return e.lease->LeaseGrant(ctx, req, &resp);
  }));
  if (!resp.error().empty()) return Unavailable("etcd lease grant: " + resp.error());
  return EtcdLease{resp.id(), resp.ttl()};
}

Status EtcdClient::LeaseRevoke(int64_t lease) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  pb::LeaseRevokeResponse resp;
  Status st = impl_->Call("lease revoke", [&](Endpoint& e, grpc::ClientContext* ctx) {
    return e.lease->LeaseRevoke(ctx, req, &resp);
  });
  if (st.code() == StatusCode::kNotFound) return LeaseExpired(st.message());
  return st;
}

Result<int64_t> EtcdClient::LeaseKeepAlive(int64_t lease) {
  pb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  pb::LeaseKeepAliveResponse resp;
  // The API has only the bidi stream; one request and one answer per call
  // keeps the deadline and failover of a unary call.
  STRATA_RETURN_IF_ERROR(
      impl_->Call("lease keep-alive", [&](Endpoint& e, grpc::ClientContext* ctx) {
        auto stream = e.lease->LeaseKeepAlive(ctx);
        if (stream->Write(req) && stream->Read(&resp)) {
          stream->WritesDone();
          // The server ends the stream when the client stops writing.
          grpc::Status finished = stream->Finish();
          (void)finished;
          return grpc::Status::OK;
        }
        return stream->Finish();
      }));
  if (resp.ttl() <= 0) {
    return LeaseExpired("etcd lease " + std::to_string(lease) + " is gone (expired or revoked)");
  }
  return resp.ttl();
}

namespace {

class PrefixWatch final : public EtcdWatch {
 public:
  PrefixWatch(std::shared_ptr<EtcdClient::Impl> impl, std::string prefix, EtcdWatchHandler handler)
      : impl_(std::move(impl)), prefix_(std::move(prefix)), handler_(std::move(handler)) {
    thread_ = std::thread([this] { Run(); });
  }

  ~PrefixWatch() override {
    {
      MutexLock lock(mu_);
      stopping_ = true;
      if (ctx_ != nullptr) ctx_->TryCancel();
    }
    cv_.notify_all();
    thread_.join();
  }

  uint64_t resets() const override { return resets_.load(); }

 private:
  void Run() {
    auto backoff = std::chrono::milliseconds(kReconnectBackoffMs);
    while (!Stopping()) {
      Result<EtcdRange> listing = ListPrefix(*impl_, prefix_);
      if (!listing.ok()) {
        Report(listing.status());
        Pause(&backoff);
        continue;
      }
      if (Stopping()) break;
      handler_.on_reset(*listing);
      resets_.fetch_add(1);
      if (WatchFrom(listing->revision + 1))
        backoff = std::chrono::milliseconds(kReconnectBackoffMs);
      Pause(&backoff);
    }
  }

  // One watch stream until it breaks, is cancelled by the server (e.g. a
  // compaction) or we stop. True when the stream was established.
  bool WatchFrom(int64_t revision) {
    auto ctx = std::make_shared<grpc::ClientContext>();
    // What etcd's own client sends (WithRequireLeader): a member cut off
    // from its cluster's leader then ends the stream ("no leader"), and the
    // next listing goes to a member that has one. Without it the stream
    // would stay open and silent, and membership would freeze.
    ctx->AddMetadata("hasleader", "true");
    {
      MutexLock lock(mu_);
      if (stopping_) return false;
      ctx_ = ctx;
    }
    std::shared_ptr<Endpoint> ep =
        impl_->endpoints[impl_->preferred.load() % impl_->endpoints.size()]->Get();
    auto stream = ep->watch->Watch(ctx.get());
    pb::WatchRequest req;
    auto* create = req.mutable_create_request();
    create->set_key(prefix_);
    create->set_range_end(PrefixRangeEnd(prefix_));
    create->set_start_revision(revision);
    bool created = false;
    bool abandoned = false;  // we end the stream, not etcd
    std::string why = "stream closed";
    if (stream->Write(req)) {
      pb::WatchResponse resp;
      while (stream->Read(&resp)) {
        if (resp.created()) created = true;
        if (resp.compact_revision() > 0 || resp.canceled()) {
          why = resp.compact_revision() > 0
                    ? "history compacted at revision " + std::to_string(resp.compact_revision())
                    : "cancelled by etcd: " + resp.cancel_reason();
          abandoned = true;
          break;
        }
        if (resp.events().empty()) continue;
        std::vector<EtcdEvent> events;
        events.reserve(resp.events_size());
        for (const auto& e : resp.events()) {
          EtcdEvent ev;
          ev.type = e.type() == ::mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete
                                                        : EtcdEvent::Type::kPut;
          ev.kv = FromPb(e.kv());
          events.push_back(std::move(ev));
        }
        handler_.on_events(events);
      }
    }
    if (abandoned) ctx->TryCancel();
    grpc::Status finished = stream->Finish();
    {
      MutexLock lock(mu_);
      ctx_.reset();
    }
    if (!Stopping()) {
      // A stream we ended finishes CANCELLED: the reason is ours to say.
      Report(finished.ok() || abandoned ? Unavailable("etcd watch " + prefix_ + ": " + why)
                                        : FromEtcd("watch " + prefix_, finished));
    }
    return created;
  }

  bool Stopping() {
    MutexLock lock(mu_);
    return stopping_;
  }

  void Report(const Status& st) {
    if (handler_.on_error) handler_.on_error(st);
  }

  void Pause(std::chrono::milliseconds* backoff) {
    MutexLock lock(mu_);
    cv_.wait_for(lock.native(), *backoff, [&] { return stopping_; });
    *backoff = std::min(*backoff * 2, std::chrono::milliseconds(kMaxReconnectBackoffMs));
  }

  std::shared_ptr<EtcdClient::Impl> impl_;
  const std::string prefix_;
  EtcdWatchHandler handler_;
  std::atomic<uint64_t> resets_{0};
  Mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::shared_ptr<grpc::ClientContext> ctx_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<EtcdWatch> EtcdClient::WatchPrefix(std::string prefix, EtcdWatchHandler handler) {
  if (!handler.on_reset) handler.on_reset = [](const EtcdRange&) {};
  if (!handler.on_events) handler.on_events = [](const std::vector<EtcdEvent>&) {};
  return std::make_unique<PrefixWatch>(impl_, std::move(prefix), std::move(handler));
}

}  // namespace strata::cluster
