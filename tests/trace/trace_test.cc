// Trace tools: parsing, the reference policies and the store replay on a
// hand-built trace with hand-computed results, and the generator.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <unordered_map>

#include "strata/trace/reference_policies.h"
#include "strata/trace/replay.h"
#include "strata/trace/trace.h"
#include "strata/trace/trace_generator.h"

namespace strata::trace {
namespace {

TraceRequest Req(uint64_t input, std::vector<uint64_t> ids) {
  TraceRequest r;
  r.input_length = input;
  r.hash_ids = std::move(ids);
  return r;
}

// Capacity 3 blocks. Worked by hand (block lists most recent first):
//   R1 [1,2,3] 1536 tok: miss.            LRU: 1 2 3
//   R2 [1,2,4] 1536 tok: hits 1,2 = 1024. LRU: 1 2 4 (3 out)
//   R3 [1,2,3] 1300 tok: hits 1,2 = 1024. LRU: 1 2 3 (4 out)
//   R4 [1,2,4] 1536 tok: hits 1,2 = 1024. LRU: 1 2 4 (3 out)
// LRU: 3072 / 5908. Belady keeps 3 (next used in R3) over 4 (R4) at R2,
// so R3 hits all three blocks (512 + 512 + 276): 1024+1300+1024 = 3348.
std::vector<TraceRequest> HandTrace() {
  return {Req(1536, {1, 2, 3}), Req(1536, {1, 2, 4}), Req(1300, {1, 2, 3}), Req(1536, {1, 2, 4})};
}

TEST(TraceTest, ReferencePoliciesOnAHandBuiltTrace) {
  const auto t = HandTrace();
  HitStats lru = SimulateLru(t, 3);
  EXPECT_EQ(lru.input_tokens, 5908u);
  EXPECT_EQ(lru.hit_tokens, 3072u);
  HitStats belady = SimulateBelady(t, 3);
  EXPECT_EQ(belady.hit_tokens, 3348u);
  // Unbounded: everything after first sight hits.
  EXPECT_EQ(SimulateLru(t, 100).hit_tokens, 1024u + 1300u + 1536u);
  EXPECT_EQ(SimulateBelady(t, 100).hit_tokens, 1024u + 1300u + 1536u);
}

TEST(TraceTest, StoreReplayWithLruEqualsTheReference) {
  const auto t = HandTrace();
  ReplayOptions o;
  o.capacity_tokens = 3 * kTraceBlockTokens;
  o.policy = "lru";
  auto r = ReplayThroughStore(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hit_tokens, 3072u);
  EXPECT_EQ(r->input_tokens, 5908u);
  EXPECT_EQ(r->inserts, 6u);  // 3 + 1 + 1 + 1
  o.full_payload = true;      // the same with real bytes fetched and verified
  r = ReplayThroughStore(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hit_tokens, 3072u);
  EXPECT_GT(r->fetched_bytes, 0u);
  for (const char* policy : {"aslru", "deadline"}) {
    o.policy = policy;
    r = ReplayThroughStore(t, o);
    ASSERT_TRUE(r.ok()) << policy << ": " << r.status().ToString();
    EXPECT_EQ(r->input_tokens, 5908u);
    EXPECT_LE(r->hit_tokens, SimulateBelady(t, 3).hit_tokens) << policy;
  }
}

TEST(TraceTest, StoreReplayMatchesReferenceOnAGeneratedTrace) {
  TraceGeneratorOptions g;
  g.conversations = 150;
  g.duration_s = 600;
  const auto t = GenerateTrace(g).value();
  for (uint64_t blocks : {20u, 200u}) {
    ReplayOptions o;
    o.capacity_tokens = blocks * kTraceBlockTokens;
    o.policy = "lru";
    auto r = ReplayThroughStore(t, o);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->hit_tokens, SimulateLru(t, blocks).hit_tokens) << blocks;
    EXPECT_LE(r->hit_tokens, SimulateBelady(t, blocks).hit_tokens);
  }
}

TEST(TraceTest, ParsesAndRejects) {
  TraceRequest r;
  ASSERT_TRUE(
      ParseTraceLine(
          R"({"timestamp": 27, "input_length": 600, "output_length": 5, "hash_ids": [0, 9]})", &r)
          .ok());
  EXPECT_EQ(r.timestamp_ms, 27);
  EXPECT_EQ(r.input_length, 600u);
  EXPECT_EQ(r.hash_ids, (std::vector<uint64_t>{0, 9}));
  EXPECT_EQ(PrefixTokens(r, 1), 512u);
  EXPECT_EQ(PrefixTokens(r, 2), 600u);
  TraceRequest back;
  ASSERT_TRUE(ParseTraceLine(FormatTraceLine(r), &back).ok());
  EXPECT_EQ(back.hash_ids, r.hash_ids);
  for (const char* bad :
       {"", "{", "[1]", R"({"timestamp": 1})",
        R"({"timestamp": 1, "input_length": 10, "hash_ids": [1,]})",
        R"({"timestamp": 1, "input_length": 10, "hash_ids": [-1]})",
        R"({"timestamp": 1.5, "input_length": 10, "hash_ids": [1]})",
        R"({"timestamp": 1, "input_length": 2000, "hash_ids": [1]})",
        R"({"timestamp": 1, "input_length": 10, "hash_ids": [1]} x)",
        // More ids than the input's blocks.
        R"({"timestamp": 1, "input_length": 1, "hash_ids": [1, 2]})",
        // A field twice: which one counts?
        R"({"timestamp": 1, "input_length": 10, "hash_ids": [1], "hash_ids": [2]})",
        R"({"timestamp": 1, "timestamp": 2, "input_length": 10, "hash_ids": [1]})"}) {
    EXPECT_EQ(ParseTraceLine(bad, &r).code(), StatusCode::kInvalidArgument) << bad;
  }
  // More blocks than the store matches in one call: refused at the line.
  std::string huge = R"({"timestamp": 1, "input_length": 2097664, "hash_ids": [0)";
  for (int i = 1; i < 4097; ++i) huge += "," + std::to_string(i);
  huge += "]}";
  const Status st = ParseTraceLine(huge, &r);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("more than 4096 hash_ids"), std::string::npos) << st.ToString();
}

TEST(TraceTest, ReadTraceNamesTheBadLine) {
  const std::string path = ::testing::TempDir() + "/bad_trace.jsonl";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("{\"timestamp\": 0, \"input_length\": 5, \"hash_ids\": [1]}\n\nnot json\n", f);
  std::fclose(f);
  auto t = ReadTrace(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(":3:"), std::string::npos) << t.status().ToString();
  EXPECT_EQ(ReadTrace(path + ".missing").status().code(), StatusCode::kNotFound);
  // A directory opens and reads as nothing: an error, not an empty trace.
  EXPECT_EQ(ReadTrace(::testing::TempDir()).status().code(), StatusCode::kInvalidArgument);
}

TEST(TraceTest, GeneratorIsDeterministicAndPrefixConsistent) {
  auto opts = TraceGeneratorOptions::Preset("agent").value();
  opts.conversations = 50;
  const auto a = GenerateTrace(opts).value();
  const auto b = GenerateTrace(opts).value();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].hash_ids, b[i].hash_ids);
  // Sorted by time; an id always sits at the same depth under the same parent.
  std::unordered_map<uint64_t, std::pair<size_t, int64_t>> where;  // id -> (depth, parent)
  size_t shared_turns = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (i > 0) {
      EXPECT_LE(a[i - 1].timestamp_ms, a[i].timestamp_ms);
    }
    EXPECT_EQ(a[i].hash_ids.size(), (a[i].input_length + 511) / 512);
    for (size_t j = 0; j < a[i].hash_ids.size(); ++j) {
      const int64_t parent = j == 0 ? -1 : static_cast<int64_t>(a[i].hash_ids[j - 1]);
      auto [it, fresh] = where.emplace(a[i].hash_ids[j], std::make_pair(j, parent));
      EXPECT_EQ(it->second, std::make_pair(j, parent));
      if (!fresh && j > 4) ++shared_turns;  // beyond the system prompt: a continued conversation
    }
  }
  EXPECT_GT(shared_turns, 0u);
  EXPECT_FALSE(TraceGeneratorOptions::Preset("nope").ok());
}

TEST(TraceTest, GeneratorRefusesOptionsOutsideTheirRange) {
  const auto refused = [](auto change) {
    TraceGeneratorOptions g;
    g.conversations = 5;
    change(g);
    return GenerateTrace(g).status().code() == StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(refused([](TraceGeneratorOptions& g) { g.duration_s = -100; }));
  EXPECT_TRUE(refused([](TraceGeneratorOptions& g) { g.duration_s = 0; }));
  EXPECT_TRUE(refused([](TraceGeneratorOptions& g) { g.duration_s = 1e300; }));
  EXPECT_TRUE(refused([](TraceGeneratorOptions& g) { g.mean_turns = std::nan(""); }));
  EXPECT_TRUE(refused([](TraceGeneratorOptions& g) { g.mean_turns = 0.5; }));
  EXPECT_TRUE(refused([](TraceGeneratorOptions& g) { g.mean_think_s = -1; }));
  EXPECT_TRUE(refused([](TraceGeneratorOptions& g) { g.system_prompt_zipf = INFINITY; }));
  // One turn on average is exactly one turn each.
  TraceGeneratorOptions one;
  one.conversations = 40;
  one.mean_turns = 1;
  auto t = GenerateTrace(one);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->size(), 40u);
  for (const TraceRequest& r : *t) EXPECT_GE(r.timestamp_ms, 0);
}

TEST(TraceTest, TwoTierReplayServesEvictedBlocksFromSsd) {
  TraceGeneratorOptions g;
  g.conversations = 60;
  g.duration_s = 300;
  g.max_context_tokens = 16 * kTraceBlockTokens;
  const auto t = GenerateTrace(g).value();
  ReplayOptions o;
  o.policy = "lru";
  o.capacity_tokens = 24 * kTraceBlockTokens;  // DRAM: longer than any request
  auto dram_only = ReplayThroughStore(t, o);
  ASSERT_TRUE(dram_only.ok()) << dram_only.status().ToString();
  // An SSD tier that holds every block: a block seen before is always found
  // (in DRAM, or on SSD and promoted), exactly as with unbounded capacity.
  o.ssd_capacity_tokens = 100'000 * kTraceBlockTokens;
  for (const char* ssd_policy : {"lru", "deadline"}) {
    o.ssd_policy = ssd_policy;
    auto two_tier = ReplayThroughStore(t, o);
    ASSERT_TRUE(two_tier.ok()) << two_tier.status().ToString();
    EXPECT_EQ(two_tier->hit_tokens, SimulateLru(t, 100'000).hit_tokens) << ssd_policy;
    EXPECT_GT(two_tier->hit_tokens, dram_only->hit_tokens);
    EXPECT_GT(two_tier->ssd_promotions, 0u);
    EXPECT_EQ(two_tier->ssd_evictions, 0u);
  }
  // A small SSD tier evicts, and stays under the optimum at its capacity,
  // the same on every run (write-back is drained before the next commit).
  o.ssd_capacity_tokens = 60 * kTraceBlockTokens;
  o.policy = "deadline";
  o.ssd_policy = "deadline";
  auto small = ReplayThroughStore(t, o);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_GT(small->ssd_evictions, 0u);
  EXPECT_LE(small->hit_tokens, SimulateBelady(t, 60).hit_tokens);
  auto again = ReplayThroughStore(t, o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->hit_tokens, small->hit_tokens);
  EXPECT_EQ(again->ssd_evictions, small->ssd_evictions);
  // A directory that cannot be created is an error, not a crash.
  o.ssd_dir = "/proc/no-such-dir";
  EXPECT_EQ(ReplayThroughStore(t, o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::trace
