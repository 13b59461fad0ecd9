// libFuzzer target: the node's request handlers, fed arbitrary bytes as
// any request message under any credentials. The handlers run against a
// real in-process CacheStore holding a few entries; after every call the
// store's invariants must hold. Input: byte 0 picks the call, byte 1 the
// credentials, the rest is the serialized request.
#include <grpcpp/test/server_context_test_spouse.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>

#include "node/node_service.h"
#include "strata/cache_store.h"

namespace strata {
namespace {

struct Harness {
  NodeState state;
  std::unique_ptr<CacheStoreService> store_service;
  std::unique_ptr<AdminService> admin_service;

  Harness() {
    CacheStoreOptions o;
    o.dram.capacity_bytes = 16ull << 20;
    o.dram.prefault = false;
    o.dram.try_huge_pages = false;
    o.maintenance_interval = 0;
    state.store = CacheStore::Open(o).value();
    state.metrics = &state.store->metrics();
    state.node_id = "fuzz";
    std::ostringstream tokens;
    tokens << HashToken("w") << " t write\n"
           << HashToken("a") << " t admin\n"
           << HashToken("o") << " * admin\n";
    const std::string text = tokens.str();
    const std::string origin = "fuzz";
    Result<TokenTable> table = TokenTable::Parse(text, origin);
    if (!table.ok()) std::abort();
    state.tokens = std::move(table).value();
    store_service = std::make_unique<CacheStoreService>(state);
    admin_service = std::make_unique<AdminService>(state);
    // A few entries so lookups, listings and evictions find something.
    const Layout layout = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
    std::vector<std::byte> bytes(layout.PayloadBytes());
    const uint64_t checksum = SealPayload(layout, layout.block_tokens, bytes).value();
    ChainKey key;
    for (int b = 0; b < 4; ++b) {
      const ChainKey parent = key;
      key.bytes[0] = static_cast<uint8_t>(b + 1);
      CommitPayload p{{key, StateKind::kGlobalKv, layout.id, bytes.size(),
                       b > 0 ? std::optional<ChainKey>(parent) : std::nullopt},
                      bytes,
                      checksum};
      (void)state.store->Commit({"t", Role::kWrite}, ModelId{}, std::span(&p, 1));
    }
  }
};

// Protobuf logs every malformed string field; the fuzzer makes many.
const bool kQuietProtobuf = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

Harness& H() {
  static Harness* h = new Harness();  // lives for the process, like a node
  return *h;
}

template <typename Req, typename Resp, typename Service>
void Run(Service* service, grpc::Status (Service::*method)(grpc::ServerContext*, const Req*, Resp*),
         grpc::ServerContext* ctx, const uint8_t* data, size_t size) {
  Req req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return;
  Resp resp;
  (void)(service->*method)(ctx, &req, &resp);
}

}  // namespace
}  // namespace strata

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  if (size < 2) return 0;
  Harness& h = H();
  grpc::ServerContext ctx;
  grpc::testing::ServerContextTestSpouse spouse(&ctx);
  static const char* kCredentials[] = {nullptr,    "Bearer w", "Bearer a", "Bearer o",
                                       "Bearer x", "Basic w",  ""};
  const char* cred = kCredentials[data[1] % 7];
  if (cred != nullptr) spouse.AddClientMetadata("authorization", cred);
  const uint8_t* body = data + 2;
  const size_t n = size - 2;
  CacheStoreService* s = h.store_service.get();
  AdminService* a = h.admin_service.get();
  switch (data[0] % 14) {
    case 0:
      Run(s, &CacheStoreService::Match, &ctx, body, n);
      break;
    case 1:
      Run(s, &CacheStoreService::Reserve, &ctx, body, n);
      break;
    case 2:
      Run(s, &CacheStoreService::Publish, &ctx, body, n);
      break;
    case 3:
      Run(s, &CacheStoreService::RenewLease, &ctx, body, n);
      break;
    case 4:
      Run(s, &CacheStoreService::Abort, &ctx, body, n);
      break;
    case 5:
      Run(s, &CacheStoreService::Stats, &ctx, body, n);
      break;
    case 6:
      Run(s, &CacheStoreService::Hello, &ctx, body, n);
      break;
    case 7:
      Run(a, &AdminService::Inspect, &ctx, body, n);
      break;
    case 8:
      Run(a, &AdminService::Pin, &ctx, body, n);
      break;
    case 9:
      Run(a, &AdminService::Delete, &ctx, body, n);
      break;
    case 10:
      Run(a, &AdminService::ListEntries, &ctx, body, n);
      break;
    case 11:
      Run(a, &AdminService::Evict, &ctx, body, n);
      break;
    case 12:
      Run(a, &AdminService::Drain, &ctx, body, n);
      break;
    default:
      h.state.store->RunMaintenance();
      break;
  }
  // Draining is sticky; undo it so the other calls stay reachable.
  h.state.draining.store(false);
  if (Status st = h.state.store->CheckInvariantsForTesting(); !st.ok()) {
    std::fprintf(stderr, "invariant broken: %s\n", st.ToString().c_str());
    std::abort();
  }
  return 0;
}
