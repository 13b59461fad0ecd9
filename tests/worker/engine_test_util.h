// Helpers the engine tests share (engine_test.cc, store_fault_test.cc):
// a three-turn conversation and the checks over the store after a run.
#pragma once

#include <memory>
#include <vector>

#include "strata/cache_store.h"
#include "strata/chain_key.h"
#include "worker_test_util.h"

namespace strata::worker::testing {

// With 256-token blocks and keep_tokens 140, turn 2 (906 tokens) decodes
// from 512, so it can use both blocks turn 1 (600 tokens) committed, and
// the SWA state turn 1 committed at its last prompt boundary (512).
inline std::vector<uint32_t> Turn1() { return Tokens(600, 1); }
inline std::vector<uint32_t> Turn2() {
  std::vector<uint32_t> t = Turn1();
  const std::vector<uint32_t> more = Tokens(306, 2);
  t.insert(t.end(), more.begin(), more.end());
  return t;
}
// Turn 3 (1,206 tokens) decodes from 1024: it can use turn 2's three blocks
// and the SWA state at turn 2's last prompt boundary (768).
inline std::vector<uint32_t> Turn3() {
  std::vector<uint32_t> t = Turn2();
  const std::vector<uint32_t> more = Tokens(300, 3);
  t.insert(t.end(), more.begin(), more.end());
  return t;
}

inline const Principal kAdmin{"default", Role::kAdmin};

inline void ExpectStoreQuiet(const std::shared_ptr<CacheStore>& cache) {
  const StoreStats s = cache->Stats();
  EXPECT_EQ(s.read_leases, 0u);
  EXPECT_EQ(s.write_leases, 0u);
  EXPECT_EQ(s.reserved_entries, 0u);
  EXPECT_TRUE(cache->CheckInvariantsForTesting().ok());
}

// The chain keys the engine derives for a prompt.
inline std::vector<ChainKey> KeysFor(const std::vector<uint32_t>& prompt) {
  Result<std::unique_ptr<Engine>> engine = Engine::Create(TinyModel(), Options(nullptr));
  EXPECT_TRUE(engine.ok());
  Result<std::vector<ChainKey>> keys =
      ChainKeys::ForPrompt(ChainRoot{"default", (*engine)->model_id(), ""}, prompt, 256);
  EXPECT_TRUE(keys.ok());
  return std::move(keys).value();
}

}  // namespace strata::worker::testing
