// Shared fixtures of the worker tests: a tiny model, a shared in-process
// store, and a helper that runs one request to completion.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "strata/cache_store.h"
#include "strata/client.h"
#include "strata/worker/engine.h"
#include "strata/worker/model.h"

namespace strata::worker::testing {

inline const ModelWeights& TinyModel() {
  static const ModelWeights* model = [] {
    Result<ModelWeights> m = ModelFromFile(RandomModelFile(TinyModelConfig(), 11));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return new ModelWeights(std::move(m).value());
  }();
  return *model;
}

inline std::shared_ptr<CacheStore> NewCacheStore() {
  CacheStoreOptions o;
  o.dram.capacity_bytes = 256ull << 20;
  o.maintenance_interval = 0;
  Result<std::unique_ptr<CacheStore>> s = CacheStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::shared_ptr<CacheStore>(std::move(s).value());
}

inline std::unique_ptr<Store> Attach(std::shared_ptr<CacheStore> cache) {
  ClientOptions co;
  co.inproc_store = std::move(cache);
  Result<std::unique_ptr<Store>> s = OpenStore("inproc://", co);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

// Forwards every call to a real store; fault injectors and counters
// override the calls they break or count.
class ForwardingStore : public Store {
 public:
  explicit ForwardingStore(Store& inner) : inner_(inner) {}
  Result<MatchResult> Match(const MatchRequest& r) override { return inner_.Match(r); }
  Result<MatchResult> MatchKeys(const MatchKeysRequest& r) override { return inner_.MatchKeys(r); }
  FetchFuture Fetch(const FetchRequest& r) override { return inner_.Fetch(r); }
  Result<Reservation> Reserve(const ModelId& m, std::span<const CommitBlock> b,
                              Nanos ttl) override {
    return inner_.Reserve(m, b, ttl);
  }
  Result<PublishResult> Publish(LeaseId l, std::span<const uint64_t> c) override {
    return inner_.Publish(l, c);
  }
  Result<PublishResult> Commit(const ModelId& m, std::span<const CommitPayload> p) override {
    return inner_.Commit(m, p);
  }
  Status RenewLease(LeaseId l, Nanos ttl) override { return inner_.RenewLease(l, ttl); }
  Status Abort(LeaseId l) override { return inner_.Abort(l); }
  Result<std::string> CallerNamespace() override { return inner_.CallerNamespace(); }

 protected:
  Store& inner_;
};

// Deterministic pseudo-text tokens.
inline std::vector<uint32_t> Tokens(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  uint64_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t[i] = static_cast<uint32_t>((x >> 33) % 256);
  }
  return t;
}

struct RunResult {
  std::vector<uint32_t> tokens;
  std::vector<std::vector<float>> logits;
  RequestStats stats;
};

inline EngineOptions Options(Store* store) {
  EngineOptions o;
  o.store = store;
  o.weights_revision = "tiny-11";
  o.return_logits = true;
  o.pool_pages = 64;
  // The store's path: a warm run fetches from the store, not from this
  // engine's HBM tier (prefix_cache_test.cc tests that tier).
  o.hbm_cache_policy = "";
  return o;
}

// Runs one request (id `id`) on an existing engine until it finishes.
inline RunResult RunOn(Engine& engine, uint64_t id, const std::vector<uint32_t>& prompt,
                       uint32_t max_new = 6) {
  Request r;
  r.id = id;
  r.prompt = prompt;
  r.max_new_tokens = max_new;
  EXPECT_TRUE(engine.AddRequest(r).ok());
  RunResult out;
  for (StepOutput& o : engine.Drain()) {
    out.tokens.insert(out.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    for (auto& l : o.logits) out.logits.push_back(std::move(l));
    if (o.finished) out.stats = o.stats;
  }
  return out;
}

inline RunResult RunOne(const EngineOptions& options, const std::vector<uint32_t>& prompt,
                        uint32_t max_new = 6) {
  Result<std::unique_ptr<Engine>> engine = Engine::Create(TinyModel(), options);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  RunResult out = RunOn(**engine, 1, prompt, max_new);
  const EngineCounters c = (*engine)->Counters();
  EXPECT_EQ(c.pool_pages_held, 0u);
  EXPECT_EQ(c.live_fetches, 0u);
  EXPECT_EQ(c.held_leases, 0u);
  return out;
}

// Bit-for-bit equality of two runs (logits compared as bytes).
inline void ExpectIdentical(const RunResult& a, const RunResult& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) {
    ASSERT_EQ(a.logits[i].size(), b.logits[i].size());
    EXPECT_EQ(
        0, std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)))
        << "logits of token " << i << " differ";
  }
}

}  // namespace strata::worker::testing
