// Helpers for tests that talk to a real strata-node.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "node_process.h"
#include "rpc/wire.h"
#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"
#include "test_util.h"

namespace strata::testing {

// Whether the process reached the stopped state ('T' in /proc/<pid>/stat)
// within a few seconds: SIGSTOP stops its threads asynchronously.
inline bool WaitStopped(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T') {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

inline std::unique_ptr<Store> Open(const NodeProcess& node, const char* token,
                                   const std::string& mode = "auto", Nanos timeout = Seconds(10)) {
  ClientOptions options;
  options.token = token;
  options.data_plane_mode = mode;
  options.timeout = timeout;
  auto store = OpenStore(node.uri(), options);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(store).value() : nullptr;
}

// A prompt of `blocks` V4.1 blocks (256 tokens each), its chain keys as the
// node derives them for the caller's namespace, and a sealed payload for
// each block and for the SWA state at its end.
struct Prompt {
  std::vector<uint32_t> tokens;
  std::vector<ChainKey> keys;  // key[0..blocks]
  std::vector<Payload> blocks;
  Payload swa;
};

inline const Layout& GlobalKv() {
  static const Layout layout = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
  return layout;
}
inline const Layout& Swa() {
  static const Layout layout = MakeSwaLayout(kV41SwaLayoutId);
  return layout;
}

inline Prompt MakePrompt(Store& store, size_t blocks, uint32_t seed) {
  Prompt p;
  p.tokens = Tokens(blocks * 256, seed);
  MatchRequest req;
  req.model_id = TestModel();
  req.tokens = p.tokens;
  req.want_swa = false;
  auto m = store.Match(req);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  p.keys.push_back(m.ok() ? m->prefix_key : ChainKey{});
  EXPECT_TRUE(!m.ok() || m->blocks.empty()) << "prompt already stored";
  for (size_t b = 0; b < blocks; ++b) {
    p.keys.push_back(
        ChainKeys::Next(p.keys.back(), std::span<const uint32_t>(p.tokens).subspan(b * 256, 256)));
    p.blocks.push_back(MakePayload(GlobalKv(), seed * 1000 + b));
  }
  p.swa = MakePayload(Swa(), seed * 1000 + 999);
  return p;
}

// Blocks [first, last) of the prompt, and its SWA state when `with_swa`.
inline std::vector<CommitPayload> Payloads(const Prompt& p, size_t first, size_t last,
                                           bool with_swa) {
  std::vector<CommitPayload> out;
  for (size_t b = first; b < last; ++b) {
    CommitPayload c;
    c.block.key = p.keys[b + 1];
    c.block.kind = StateKind::kGlobalKv;
    c.block.layout_id = kV41GlobalKvLayoutId;
    c.block.payload_bytes = p.blocks[b].bytes.size();
    if (b > 0) c.block.parent = p.keys[b];
    c.bytes = p.blocks[b].bytes;
    c.checksum = p.blocks[b].checksum;
    out.push_back(c);
  }
  if (with_swa) {
    CommitPayload c;
    c.block.key = p.keys[last];
    c.block.kind = StateKind::kSwaState;
    c.block.layout_id = kV41SwaLayoutId;
    c.block.payload_bytes = p.swa.bytes.size();
    c.bytes = p.swa.bytes;
    c.checksum = p.swa.checksum;
    out.push_back(c);
  }
  return out;
}

inline void CommitAll(Store& store, const Prompt& p, bool with_swa = true) {
  auto payloads = Payloads(p, 0, p.blocks.size(), with_swa);
  auto r = store.Commit(TestModel(), payloads);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const Status& s : r->blocks) ASSERT_TRUE(s.ok()) << s.ToString();
}

inline Result<MatchResult> MatchPrompt(Store& store, const Prompt& p, bool lease = true) {
  MatchRequest req;
  req.model_id = TestModel();
  req.tokens = p.tokens;
  req.take_lease = lease;
  return store.Match(req);
}

// Fetches everything the match found; buffers come back in `blocks`/`swa`.
struct Fetched {
  FetchOutcome outcome;
  std::vector<std::vector<std::byte>> blocks;
  std::vector<std::byte> swa;
  std::vector<FetchEvent> events;
};
inline Fetched FetchAll(Store& store, const MatchResult& m) {
  Fetched f;
  FetchRequest req;
  req.match = &m;
  for (const BlockMatch& b : m.blocks) {
    f.blocks.emplace_back(b.payload_bytes);
  }
  for (auto& b : f.blocks) req.block_buffers.emplace_back(b);
  if (m.swa.has_value()) {
    f.swa.resize(m.swa->entry.payload_bytes);
    req.swa_buffer = f.swa;
  }
  req.on_event = [&](const FetchEvent& e) { f.events.push_back(e); };
  f.outcome = store.Fetch(req).Wait();
  return f;
}

// A raw control-plane call to host:port with a token (nullptr: none).
template <typename Fn>
Status RawCall(const std::string& target, const char* token, Fn fn) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (token != nullptr) ctx.AddMetadata("authorization", std::string("Bearer ") + token);
  grpc::Status st = fn(channel, &ctx);
  if (st.ok()) return Status::Ok();
  // The node puts the exact code in the details (grpc_status.cc).
  const std::string& d = st.error_details();
  if (!d.empty()) return {static_cast<StatusCode>(std::stoi(d)), st.error_message()};
  return {StatusCode::kUnavailable, st.error_message()};
}

template <typename Fn>
Status RawCall(const NodeProcess& node, const char* token, Fn fn) {
  return RawCall(node.target(), token, fn);
}

// The operator token by default: node-wide figures (a tenant sees only its own).
inline v1::StatsResponse NodeStats(const std::string& target,
                                   const char* token = kTokenOperator.token) {
  v1::StatsResponse resp;
  Status st = RawCall(target, token, [&](auto channel, grpc::ClientContext* ctx) {
    return v1::CacheStore::NewStub(channel)->Stats(ctx, v1::StatsRequest(), &resp);
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return resp;
}
inline v1::StatsResponse NodeStats(const NodeProcess& node,
                                   const char* token = kTokenOperator.token) {
  return NodeStats(node.target(), token);
}

}  // namespace strata::testing
