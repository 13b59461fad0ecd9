#include "strata/trace/replay.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "strata/cache_store.h"

namespace strata::trace {
namespace {

constexpr uint32_t kMetadataLayoutId = 900;
constexpr uint32_t kFullLayoutId = 901;
constexpr size_t kCommitBatch = 64;

Layout ReplayLayout(bool full) {
  if (full) {
    GlobalKvShape shape;
    shape.block_tokens = kTraceBlockTokens;
    return MakeGlobalKvLayout(kFullLayoutId, shape);
  }
  // One byte of body: the entry carries a real header and checksum, but its
  // bytes are not the point.
  return Layout{kMetadataLayoutId, StateKind::kGlobalKv, kTraceBlockTokens, {{"meta", 1}}};
}

}  // namespace

Result<ReplayResult> ReplayThroughStore(const std::vector<TraceRequest>& requests,
                                        const ReplayOptions& o) {
  const Layout layout = ReplayLayout(o.full_payload);
  const uint32_t granule = o.full_payload ? 4096 : 128;
  const uint64_t slot = (layout.PayloadBytes() + granule - 1) / granule * granule;
  const uint64_t capacity_blocks = o.capacity_tokens / kTraceBlockTokens;
  if (capacity_blocks == 0) return InvalidArgument("capacity below one block");

  CacheStoreOptions so;
  so.dram.capacity_bytes = capacity_blocks * slot;
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
  std::unique_ptr<CacheStore> store = std::move(opened).value();
  const Principal caller{"replay", Role::kWrite};
  const ModelId model = ModelFingerprint{"trace-replay", "hash-ids", "none", 1, "fp4"}.Id();

  // One sealed payload serves every block: checksums are per entry.
  std::vector<std::byte> payload(layout.PayloadBytes());
  for (size_t i = layout.HeaderBytes(); i < payload.size(); ++i) {
    payload[i] = static_cast<std::byte>(i * 131);
  }
  const uint64_t checksum = SealPayload(layout, kTraceBlockTokens, payload).value();
  std::vector<std::byte> fetch_buffer;

  // Chain keys are the client's work (it hashes its tokens): derive them all
  // before the clock starts, so ops/s measures the store.
  const ChainKey root = ChainKeys::Root({caller.ns, model, ""});
  std::vector<std::vector<ChainKey>> request_keys(requests.size());
  {
    std::unordered_map<uint64_t, ChainKey> key_of;  // hash id -> chain key
    key_of.reserve(requests.size() * 4);
    for (size_t i = 0; i < requests.size(); ++i) {
      std::vector<ChainKey>& keys = request_keys[i];
      for (size_t j = 0; j < requests[i].hash_ids.size(); ++j) {
        const uint64_t id = requests[i].hash_ids[j];
        auto it = key_of.find(id);
        if (it == key_of.end()) {
          const uint32_t as_tokens[2] = {static_cast<uint32_t>(id),
                                         static_cast<uint32_t>(id >> 32)};
          it = key_of.emplace(id, ChainKeys::Next(j == 0 ? root : keys.back(), as_tokens)).first;
        }
        keys.push_back(it->second);
      }
    }
  }
  std::vector<CommitPayload> batch;
  std::vector<std::vector<std::byte>> buffers;

  ReplayResult out;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    const TraceRequest& r = requests[i];
    const std::vector<ChainKey>& keys = request_keys[i];
    MatchKeysRequest mreq;
    mreq.model_id = model;
    mreq.root = root;
    mreq.keys = keys;
    mreq.block_tokens = kTraceBlockTokens;
    mreq.want_swa = false;
    // Promotion needs a lease: it pins the promoted blocks for the caller.
    mreq.take_lease = o.full_payload || two_tier;
    mreq.promote_ssd = two_tier;
    auto m = store->MatchKeys(caller, mreq);
    if (!m.ok()) return m.status();
    size_t hit = m->blocks.size();
    out.lookups += std::min(hit + 1, keys.size());

    if (o.full_payload && hit > 0) {
      buffers.resize(hit);
      FetchRequest freq;
      freq.match = &*m;
      for (size_t b = 0; b < hit; ++b) {
        buffers[b].resize(m->blocks[b].payload_bytes);
        freq.block_buffers.emplace_back(buffers[b]);
      }
      const FetchOutcome fetched = store->Fetch(caller, freq).Wait();
      hit = fetched.blocks_ready;  // only verified bytes count as a hit
      out.fetched_bytes += fetched.bytes;
    }
    if (m->lease != 0) (void)store->Abort(caller, m->lease);
    out.input_tokens += r.input_length;
    out.hit_tokens += PrefixTokens(r, hit);

    // Blocks past the capacity could never all stay: like the references
    // (insert all, then evict the deepest), keep the first capacity_blocks.
    const size_t keep = std::min<size_t>(keys.size(), capacity_blocks);
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
      auto res = store->Commit(caller, model, batch);
      if (!res.ok()) {
        if (res.status().code() == StatusCode::kResourceExhausted) break;  // bigger than the cache
        return res.status();
      }
      out.inserts += res->published;
      out.committed_bytes += uint64_t{res->published} * payload.size();
      // Written back before the next commit can evict them, so the SSD
      // tier's content does not depend on the write-back thread's timing.
      if (two_tier) store->FlushWriteBack();
    }
    if (o.progress && ((i + 1) % o.progress_every == 0 || i + 1 == requests.size())) {
      o.progress(i + 1, requests.size());
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.block_ops = out.lookups + out.inserts;
  const StoreStats stats = store->Stats();
  for (uint64_t n : stats.evictions) out.evictions += n;
  out.ssd_promotions = stats.ssd_promotions;
  out.ssd_evictions = stats.ssd.evictions;
  return out;
}

}  // namespace strata::trace
