// Helpers shared by the store tests: small layouts, payload builders, a
// store with a manual clock, and a small tmpfs for full-disk tests.
#pragma once

#include <sys/mount.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "strata/cache_store.h"
#include "strata/chain_key.h"
#include "strata/layout.h"

namespace strata::testing {

// Tiny layouts keep tests fast: 4-token blocks, a few hundred bytes each.
constexpr uint32_t kTinyGlobalLayout = 100;
constexpr uint32_t kTinySwaLayout = 101;
constexpr uint32_t kTinyBlockTokens = 4;

inline Layout TinyGlobalLayout() {
  return {kTinyGlobalLayout,
          StateKind::kGlobalKv,
          kTinyBlockTokens,
          {{"g0", 96}, {"g1", 64}, {"g2", 32}}};
}
inline Layout TinySwaLayout() {
  return {kTinySwaLayout, StateKind::kSwaState, 8, {{"layer.0", 128}, {"layer.1", 128}}};
}

struct Payload {
  std::vector<std::byte> bytes;
  uint64_t checksum = 0;
};

// A sealed payload whose body is random bytes from `seed`.
inline Payload MakePayload(const Layout& layout, uint64_t seed, uint32_t tokens = 0) {
  Payload p;
  p.bytes.resize(layout.PayloadBytes());
  std::mt19937_64 rng(seed);
  for (size_t i = layout.HeaderBytes(); i < p.bytes.size(); ++i) {
    p.bytes[i] = static_cast<std::byte>(rng());
  }
  const uint32_t count = tokens != 0 ? tokens : layout.block_tokens;
  p.checksum = SealPayload(layout, count, p.bytes).value();
  return p;
}

// n bytes from a seeded generator.
inline std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

inline std::vector<uint32_t> Tokens(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  std::mt19937 rng(seed);
  for (auto& x : t) x = rng() % 50000;
  return t;
}

// A tmpfs of `size_bytes` mounted on a fresh directory under /var/tmp, so a
// test can fill a file system without filling the machine's. Unmounted and
// removed on destruction. Mounting needs root (CAP_SYS_ADMIN); where it
// fails, mounted() is false and error() says why, for GTEST_SKIP.
class ScopedTmpfs {
 public:
  explicit ScopedTmpfs(uint64_t size_bytes) {
    std::string tmpl = "/var/tmp/strata-tmpfs-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      error_ = std::string("mkdtemp: ") + std::strerror(errno);
      return;
    }
    path_ = tmpl;
    const std::string options = "size=" + std::to_string(size_bytes);
    if (::mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      error_ = std::string("cannot mount a size-limited tmpfs here (needs root): ") +
               std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~ScopedTmpfs() {
    Detach();
    // Only the empty mount point is left once detached.
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScopedTmpfs(const ScopedTmpfs&) = delete;
  ScopedTmpfs& operator=(const ScopedTmpfs&) = delete;

  // Unmounts now, lazily: files still open keep the tmpfs alive (and
  // usable) until closed, and no mount is left behind should the test
  // crash from here on.
  void Detach() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    mounted_ = false;
  }

  bool mounted() const { return mounted_; }
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_;
  std::string error_;
  bool mounted_ = false;
};

inline ModelId TestModel() {
  ModelFingerprint fp{"weights-r1", "tok-1", "tmpl-1", 1, "fp4"};
  return fp.Id();
}

struct TestStore {
  ManualClock clock;
  std::unique_ptr<CacheStore> store;
  Principal writer{"tenant-a", Role::kAdmin};

  explicit TestStore(uint64_t capacity = 1 << 20, double high = 0.95, double low = 0.85,
                     const std::string& policy = "lru",
                     uint64_t max_leased_entries = uint64_t{1} << 20, double max_held_share = 1.0,
                     double committed_share = 1.0) {
    CacheStoreOptions o;
    o.max_leased_entries_per_namespace = max_leased_entries;
    o.max_held_share_per_namespace = max_held_share;
    o.committed_share_per_namespace = committed_share;
    o.dram.capacity_bytes = capacity;
    o.dram.granule_bytes = 256;
    o.dram.prefault = false;
    o.dram.try_huge_pages = false;
    o.high_watermark = high;
    o.low_watermark = low;
    o.maintenance_interval = 0;
    o.clock = &clock;
    o.index_shards = 8;
    o.eviction_policy = policy;
    o.extra_layouts = {TinyGlobalLayout(), TinySwaLayout()};
    store = CacheStore::Open(o).value();
  }

  // Keys of the full tiny blocks of `tokens` for `who`.
  std::vector<ChainKey> Keys(std::span<const uint32_t> tokens, const Principal& who) const {
    return ChainKeys::ForPrompt({who.ns, TestModel(), ""}, tokens, kTinyBlockTokens).value();
  }

  // Commits GLOBAL_KV blocks [from, to) of `tokens`; payload seeds derive
  // from the keys so equal blocks get equal bytes.
  Result<PublishResult> CommitBlocks(std::span<const uint32_t> tokens, size_t from, size_t to,
                                     const Principal& who) {
    const std::vector<ChainKey> keys = Keys(tokens, who);
    std::vector<Payload> payloads;
    std::vector<CommitPayload> commit;
    for (size_t b = from; b < to; ++b)
      payloads.push_back(MakePayload(TinyGlobalLayout(), keys[b].Prefix64()));
    for (size_t b = from; b < to; ++b) {
      CommitBlock cb{keys[b], StateKind::kGlobalKv, kTinyGlobalLayout,
                     TinyGlobalLayout().PayloadBytes(), std::nullopt};
      if (b > 0) cb.parent = keys[b - 1];
      commit.push_back({cb, payloads[b - from].bytes, payloads[b - from].checksum});
    }
    return store->Commit(who, TestModel(), commit);
  }
  Result<PublishResult> CommitBlocks(std::span<const uint32_t> tokens, size_t from, size_t to) {
    return CommitBlocks(tokens, from, to, writer);
  }

  Status CommitSwa(const ChainKey& boundary_key, uint64_t seed, const Principal& who) {
    Payload p = MakePayload(TinySwaLayout(), seed, 5);
    CommitPayload cp{{boundary_key, StateKind::kSwaState, kTinySwaLayout,
                      TinySwaLayout().PayloadBytes(), std::nullopt},
                     p.bytes,
                     p.checksum};
    auto r = store->Commit(who, TestModel(), std::span(&cp, 1));
    if (!r.ok()) return r.status();
    return r->blocks[0];
  }

  MatchRequest Request(std::span<const uint32_t> tokens, Nanos lease_ttl = 0) const {
    MatchRequest req;
    req.model_id = TestModel();
    req.tokens = tokens;
    req.block_tokens = kTinyBlockTokens;
    req.take_lease = lease_ttl > 0;
    req.lease_ttl = lease_ttl;
    return req;
  }
};

}  // namespace strata::testing
