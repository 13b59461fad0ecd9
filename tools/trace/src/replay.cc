#include "strata/trace/replay.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "strata/cache_store.h"
#include "strata/client.h"
#include "strata/store.h"

namespace strata::trace {
namespace {

constexpr uint32_t kMetadataLayoutId = 900;
constexpr uint32_t kFullLayoutId = 901;
constexpr size_t kCommitBatch = 64;
constexpr const char* kNamespace = "replay";  // also salts the chain root

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// What the per-request loop needs besides the store.
struct ReplayPlan {
  const Layout* layout = nullptr;
  ModelId model;
  ChainKey root;
  uint64_t capacity_blocks = 0;
  bool fetch = false;                  // full payload: fetch every hit, count only verified bytes
  bool take_lease = false;             // a fetch or a promotion needs a lease
  bool promote_ssd = false;            // two-tier: a match reads SSD-only blocks into DRAM
  std::function<void()> after_commit;  // two-tier: drain the write-back queue
};

// Chain keys are the client's work (it hashes its tokens): derived before
// the clock starts, so ops/s measures the store.
std::vector<std::vector<ChainKey>> DeriveKeys(const std::vector<TraceRequest>& requests,
                                              const ChainKey& root) {
  std::vector<std::vector<ChainKey>> request_keys(requests.size());
  std::unordered_map<uint64_t, ChainKey> key_of;  // hash id -> chain key
  key_of.reserve(requests.size() * 4);
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<ChainKey>& keys = request_keys[i];
    for (size_t j = 0; j < requests[i].hash_ids.size(); ++j) {
      const uint64_t id = requests[i].hash_ids[j];
      auto it = key_of.find(id);
      if (it == key_of.end()) {
        const uint32_t as_tokens[2] = {static_cast<uint32_t>(id), static_cast<uint32_t>(id >> 32)};
        it = key_of.emplace(id, ChainKeys::Next(j == 0 ? root : keys.back(), as_tokens)).first;
      }
      keys.push_back(it->second);
    }
  }
  return request_keys;
}

// Per request: match -> fetch the hit -> commit the missed blocks.
Status Drive(Store& store, const ReplayPlan& plan, const std::vector<TraceRequest>& requests,
             const ReplayOptions& o, ReplayResult* out) {
  const Layout& layout = *plan.layout;
  // One sealed payload serves every block: checksums are per entry.
  std::vector<std::byte> payload(layout.PayloadBytes());
  for (size_t i = layout.HeaderBytes(); i < payload.size(); ++i) {
    payload[i] = static_cast<std::byte>(i * 131);
  }
  Result<uint64_t> sealed = SealPayload(layout, kTraceBlockTokens, payload);
  if (!sealed.ok()) return sealed.status();
  const uint64_t checksum = *sealed;
  const std::vector<std::vector<ChainKey>> request_keys = DeriveKeys(requests, plan.root);
  std::vector<CommitPayload> batch;
  std::vector<std::vector<std::byte>> buffers;

  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    const TraceRequest& r = requests[i];
    const std::vector<ChainKey>& keys = request_keys[i];
    MatchKeysRequest mreq;
    mreq.model_id = plan.model;
    mreq.root = plan.root;
    mreq.keys = keys;
    mreq.block_tokens = kTraceBlockTokens;
    mreq.want_swa = false;
    mreq.take_lease = plan.take_lease;
    mreq.promote_ssd = plan.promote_ssd;
    auto m = store.MatchKeys(mreq);
    if (!m.ok()) return m.status();
    size_t hit = m->blocks.size();
    out->lookups += std::min(hit + 1, keys.size());

    if (plan.fetch && hit > 0) {
      buffers.resize(hit);
      FetchRequest freq;
      freq.match = &*m;
      for (size_t b = 0; b < hit; ++b) {
        buffers[b].resize(m->blocks[b].payload_bytes);
        freq.block_buffers.emplace_back(buffers[b]);
      }
      const FetchOutcome fetched = store.Fetch(freq).Wait();
      hit = fetched.blocks_ready;  // only verified bytes count as a hit
      out->fetched_bytes += fetched.bytes;
    }
    // Ended now, not queued (Release): a node would otherwise still pin the
    // blocks just hit while the commit below picks its victims.
    if (m->lease != 0) (void)store.Abort(m->lease);
    out->input_tokens += r.input_length;
    out->hit_tokens += PrefixTokens(r, hit);

    // Blocks past the capacity could never all stay: like the references
    // (insert all, then evict the deepest), keep the first capacity_blocks.
    const size_t keep = std::min<size_t>(keys.size(), plan.capacity_blocks);
    for (size_t b = hit; b < keep; b += kCommitBatch) {
      batch.clear();
      for (size_t j = b; j < std::min(keep, b + kCommitBatch); ++j) {
        CommitPayload cp;
        cp.block = {keys[j], StateKind::kGlobalKv, layout.id, payload.size(), std::nullopt};
        if (j > 0) cp.block.parent = keys[j - 1];
        cp.bytes = payload;
        cp.checksum = checksum;
        batch.push_back(cp);
      }
      auto res = store.Commit(plan.model, batch);
      if (!res.ok()) {
        if (res.status().code() == StatusCode::kResourceExhausted) break;  // bigger than the cache
        return res.status();
      }
      out->inserts += res->published;
      out->committed_bytes += uint64_t{res->published} * payload.size();
      if (plan.after_commit) plan.after_commit();
    }
    if (o.progress && ((i + 1) % o.progress_every == 0 || i + 1 == requests.size())) {
      o.progress(i + 1, requests.size());
    }
  }
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out->block_ops = out->lookups + out->inserts;
  return Status::Ok();
}

Result<ReplayResult> ReplayThroughNode(const std::vector<TraceRequest>& requests,
                                       const ReplayOptions& o, ReplayPlan plan) {
  const ReplayOptions defaults;
  if (o.ssd_capacity_tokens > 0 || o.policy != defaults.policy) {
    return InvalidArgument(
        "replay against a node: its own configuration sets the policy and the SSD tier");
  }
  // One node: a cluster would place and replicate blocks, which the
  // in-process figures say nothing about.
  if (o.store_uri.rfind("strata://", 0) != 0 || o.store_uri.find(',') != std::string::npos) {
    return InvalidArgument("replay against a node: expected strata://host:port, got '" +
                           o.store_uri + "'");
  }
  ClientOptions co;
  co.token = o.token;
  auto opened = OpenStore(o.store_uri, co);
  if (!opened.ok()) return opened.status();
  // As a worker does: a lease for every match, which is also what makes a
  // node with an SSD tier promote SSD-only blocks before it answers.
  plan.take_lease = true;
  ReplayResult out;
  Status st = Drive(**opened, plan, requests, o, &out);
  if (st.message().find("layout") != std::string::npos) {
    // The node lacks the replay's layout (or has another under its id).
    return Status(st.code(), st.message() + " (does the node have extra_layouts=\"" +
                                 FormatLayoutSpec(*plan.layout) + "\"?)");
  }
  if (!st.ok()) return st;
  return out;
}

}  // namespace

Layout ReplayLayout(bool full_payload) {
  if (full_payload) {
    GlobalKvShape shape;
    shape.block_tokens = kTraceBlockTokens;
    return MakeGlobalKvLayout(kFullLayoutId, shape);
  }
  // One byte of body: the entry carries a real header and checksum, but its
  // bytes are not the point.
  return Layout{kMetadataLayoutId, StateKind::kGlobalKv, kTraceBlockTokens, {{"meta", 1}}};
}

uint64_t ReplayNodeDramBytes(uint64_t capacity_tokens, bool full_payload) {
  return capacity_tokens / kTraceBlockTokens *
         RoundUp(ReplayLayout(full_payload).PayloadBytes(), DramArenaOptions{}.granule_bytes);
}

Result<ReplayResult> ReplayThroughStore(const std::vector<TraceRequest>& requests,
                                        const ReplayOptions& o) {
  const Layout layout = ReplayLayout(o.full_payload);
  const uint64_t capacity_blocks = o.capacity_tokens / kTraceBlockTokens;
  if (capacity_blocks == 0) return InvalidArgument("capacity below one block");
  ReplayPlan plan;
  plan.layout = &layout;
  plan.model = ModelFingerprint{"trace-replay", "hash-ids", "none", 1, "fp4"}.Id();
  plan.root = ChainKeys::Root({kNamespace, plan.model, ""});
  plan.capacity_blocks = capacity_blocks;
  plan.fetch = o.full_payload;
  if (!o.store_uri.empty()) return ReplayThroughNode(requests, o, std::move(plan));

  const uint32_t granule = o.full_payload ? DramArenaOptions{}.granule_bytes : 128;
  CacheStoreOptions so;
  so.dram.capacity_bytes = capacity_blocks * RoundUp(layout.PayloadBytes(), granule);
  so.dram.granule_bytes = granule;
  so.dram.prefault = true;
  so.high_watermark = so.low_watermark = 1.0;  // evict on demand only, as the references do
  so.global_kv_ttl = Hours(24 * 365);          // a trace replays faster than any TTL
  so.maintenance_interval = 0;
  so.eviction_policy = o.policy;
  so.extra_layouts = {layout};
  const bool two_tier = o.ssd_capacity_tokens > 0;
  // Owned by this call: removed on every return, after the store closes.
  struct OwnedDir {
    std::string path;
    ~OwnedDir() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
  } ssd_dir;
  if (two_tier) {
    const uint64_t ssd_blocks = o.ssd_capacity_tokens / kTraceBlockTokens;
    if (ssd_blocks == 0) return InvalidArgument("SSD capacity below one block");
    std::string tmpl = o.ssd_dir + "/strata-replay-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return InvalidArgument("cannot create a directory under " + o.ssd_dir + ": " +
                             std::strerror(errno));
    }
    ssd_dir.path = tmpl;
    SsdTierOptions ssd;
    ssd.dir = ssd_dir.path;
    ssd.capacity_bytes = ssd_blocks * SsdIoBytes(layout.PayloadBytes());
    ssd.high_watermark = ssd.low_watermark = 1.0;  // evict on demand, like DRAM here
    ssd.ttl = so.global_kv_ttl;
    ssd.sync = false;        // a replay needs no crash safety
    ssd.min_free_bytes = 0;  // the capacity is what the run may use
    ssd.eviction_policy = o.ssd_policy;
    so.ssd = ssd;
    so.ssd_admission = CacheStoreOptions::SsdAdmission::kAllGlobalKv;
  }
  auto opened = CacheStore::Open(so);
  if (!opened.ok()) return opened.status();
  std::shared_ptr<CacheStore> cache = std::move(opened).value();
  std::unique_ptr<Store> store = OpenInProcessStore(cache, Principal{kNamespace, Role::kWrite});
  // Promotion needs a lease: it pins the promoted blocks for the caller.
  plan.take_lease = o.full_payload || two_tier;
  plan.promote_ssd = two_tier;
  // Written back before the next commit can evict them, so the SSD tier's
  // content does not depend on the write-back thread's timing.
  // By reference: the store must close (below) before ssd_dir is removed.
  if (two_tier) plan.after_commit = [&cache] { cache->FlushWriteBack(); };

  ReplayResult out;
  STRATA_RETURN_IF_ERROR(Drive(*store, plan, requests, o, &out));
  const StoreStats stats = cache->Stats();
  for (uint64_t n : stats.evictions) out.evictions += n;
  out.ssd_promotions = stats.ssd_promotions;
  out.ssd_evictions = stats.ssd.evictions;
  return out;
}

}  // namespace strata::trace
