// The cluster client. Chain keys are derived once, here; every per-node
// call is an ordinary node call through a NodeClient (remote_store.h), so
// deadlines, retries, restart detection and verified fetches are the node
// client's. What this file adds is placement, fan-out and combination:
//
//  - match: every node that may hold one of the prompt's blocks is asked,
//    in parallel, for exactly those keys, each key on its own (a node holds
//    only some of a prompt's blocks). The usable prefix is the leading run
//    of blocks that at least one replica reported. The cluster lease maps to
//    the nodes' leases and remembers which nodes hold which block.
//  - fetch: each block from the first replica that reported it; blocks
//    that fail move to the next replica in a second round, within the
//    deadline; what no replica delivers cuts the prefix.
//  - commit: each block to its R write replicas, in parallel; a block is
//    OK when at least one replica holds it.
//  - a node that stops answering (a call past its deadline, a read refused
//    as unavailable) is skipped for a second, then probed by one call (a
//    read that asks it, or an empty read beside a write that passed it
//    over); each failed probe doubles the wait, up to 8 s. A hung node
//    (alive, sockets open) would otherwise cost every request a node
//    deadline, and a static node list never drops it. While it is down its
//    share of new blocks goes to the next node in each block's placement
//    order (reads ask both), so a dead node costs the blocks it held, not a
//    steady share of misses; once a probe finds it answering, its blocks go
//    back to it.
#include "cluster/cluster_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "cluster/placement.h"
#include "remote/remote_store.h"
#include "strata/layout.h"
#include "strata/task_pool.h"

namespace strata {
namespace {

constexpr Nanos kFirstSkip = Seconds(1);
constexpr Nanos kMaxSkip = Seconds(8);
// After an outage of length d, reads also ask the node ranked next for the
// node's blocks for d, within these bounds: its share of what was written
// meanwhile went there, and is still there.
constexpr Nanos kMinCatchUp = Seconds(10);
constexpr Nanos kMaxCatchUp = Minutes(10);
// A node's default read lease TTL (CacheStoreOptions), for a renewal with ttl 0.
constexpr Nanos kDefaultReadLeaseTtl = Seconds(10);
constexpr size_t kMaxTrackedLeases = 4096;
constexpr uint32_t kMaxReplication = 16;

// Our connection to one node and what we learned of its answering. The
// client is created on first use; both are kept while the node stays in the
// membership (across changes of its drain flag).
struct NodeLink {
  std::mutex mu;
  std::shared_ptr<NodeClient> client;
  bool connecting = false;  // one caller connects, without holding mu
  // Not answering: calls skip the node until skip_until, when one goes
  // through as a probe (and moves skip_until on by skip_for, so the others
  // keep skipping while it runs). skip_for 0: the node answers.
  Nanos skip_for = 0;
  Nanos skip_until = 0;
  Nanos struck_at = 0;   // calls started before a strike are old news...
  Nanos cleared_at = 0;  // ...and so are those started before it answered again
  Nanos down_since = 0;  // the first strike of the latest outage
  Nanos catch_up_until = 0;
  Status last_error;
};

// One node of a view: as the membership lists it, and our link to it.
struct NodeConn {
  NodeConn(NodeInfo n, std::shared_ptr<NodeLink> l) : info(std::move(n)), link(std::move(l)) {}
  const NodeInfo info;
  const std::shared_ptr<NodeLink> link;
};

// The membership as of one change: placement and connections, by index.
struct View {
  explicit View(std::vector<NodeInfo> nodes) : placement(std::move(nodes)) {}
  Placement placement;
  uint32_t replication = 1;  // R: replicas per block
  std::vector<std::shared_ptr<NodeConn>> conns;
};

// A replica that reported a block, under its node's read lease.
struct Holder {
  std::shared_ptr<NodeConn> node;
  LeaseId lease = 0;
  BlockMatch block;
  size_t rank = 0;  // the node's place in the block's placement order
};

struct ReadLease {
  std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>> parts;
  std::vector<std::vector<Holder>> holders;  // per block of the prefix, best first
  std::vector<Holder> swa;                   // replicas of the SWA entry, best first
  Nanos expiry = 0;
};

struct WritePart {
  std::shared_ptr<NodeConn> node;
  std::vector<size_t> positions;  // block of the cluster reservation, per node block
  Reservation reservation;
};

struct WriteLease {
  std::vector<WritePart> parts;
  std::vector<std::vector<std::byte>> staging;  // per block; what the caller writes
  std::vector<uint32_t> present;                // per block: replicas that had it already
  std::vector<Status> failed;                   // per block: why no replica took it
  Nanos expiry = 0;
  // Left alone this long (one more lease TTL past expiry, as RemoteStore
  // does), the lease and its staging are dropped; under leases_mu_.
  Nanos reclaim_at = 0;
};

// Block-wise outcome of a fan-out write, combined over replicas.
struct WriteTally {
  explicit WriteTally(size_t n) : replicas(n, 0), first_error(n) {}
  std::vector<uint32_t> replicas;
  std::vector<Status> first_error;

  void Ok(size_t b) { ++replicas[b]; }
  void Fail(size_t b, const Status& st) {
    if (first_error[b].ok()) first_error[b] = st;
  }
  PublishResult Result() const {
    PublishResult out;
    out.replicas = replicas;
    for (size_t b = 0; b < replicas.size(); ++b) {
      if (replicas[b] > 0) {
        out.blocks.push_back(Status::Ok());
        ++out.published;
      } else {
        out.blocks.push_back(first_error[b].ok() ? Unavailable("no replica took the block")
                                                 : first_error[b]);
      }
    }
    return out;
  }
};

// Forwards a multi-node fetch's events to the caller with prompt-wide block
// numbers, one at a time, and announces a layer group done once every block
// of the prefix has it.
class FetchEvents {
 public:
  FetchEvents(const std::function<void(const FetchEvent&)>& sink, size_t blocks)
      : sink_(sink), groups_(blocks) {}

  void Group(size_t block, uint32_t group) {
    if (!sink_) return;
    std::lock_guard lock(mu_);
    std::vector<bool>& g = groups_[block];
    if (g.size() <= group) g.resize(group + 1, false);
    if (g[group]) return;
    g[group] = true;
    sink_({FetchEvent::Type::kGroupReady, static_cast<uint32_t>(block), group});
    AnnounceLocked(groups_.size());
  }

  void Block(size_t block) {
    if (!sink_) return;
    std::lock_guard lock(mu_);
    sink_({FetchEvent::Type::kBlockReady, static_cast<uint32_t>(block), 0});
  }

  // Whether any / this group of `block` was reported ready: the caller may
  // be reading it already, so it must not be written again.
  bool AnyGroup(size_t block) {
    if (!sink_) return false;
    std::lock_guard lock(mu_);
    for (bool g : groups_[block]) {
      if (g) return true;
    }
    return false;
  }
  bool HasGroup(size_t block, uint32_t group) {
    std::lock_guard lock(mu_);
    return group < groups_[block].size() && groups_[block][group];
  }

  // The SWA state verified on the node that served it: reported at once,
  // ahead of the bodies (a worker needs it before layer 0), and once.
  void Swa() {
    if (!sink_) return;
    std::lock_guard lock(mu_);
    if (swa_reported_) return;
    swa_reported_ = true;
    sink_({FetchEvent::Type::kSwaReady, 0, 0});
  }
  // Whether the caller may be reading the SWA buffer already: it must not
  // be written again.
  bool SwaReported() {
    std::lock_guard lock(mu_);
    return swa_reported_;
  }

  void Finish(size_t usable, bool swa_ready) {
    if (!sink_) return;
    std::lock_guard lock(mu_);
    AnnounceLocked(usable);
    if (swa_ready && !swa_reported_) sink_({FetchEvent::Type::kSwaReady, 0, 0});
  }

 private:
  void AnnounceLocked(size_t prefix) {
    while (prefix > 0) {
      for (size_t b = 0; b < prefix; ++b) {
        if (announced_ >= groups_[b].size() || !groups_[b][announced_]) return;
      }
      sink_({FetchEvent::Type::kLayerGroupDone, static_cast<uint32_t>(prefix), announced_});
      ++announced_;
    }
  }

  const std::function<void(const FetchEvent&)>& sink_;
  std::mutex mu_;
  std::vector<std::vector<bool>> groups_;
  uint32_t announced_ = 0;
  bool swa_reported_ = false;
};

class ClusterStore final : public Store {
 public:
  // `replication_factor` 0: the membership's setting, followed as it changes.
  ClusterStore(std::shared_ptr<Membership> membership, ClientOptions options,
               uint32_t replication_factor, Nanos call_timeout)
      : membership_(std::move(membership)),
        node_options_(std::move(options)),
        replication_option_(replication_factor),
        call_timeout_(call_timeout),
        pool_(std::clamp<size_t>(4 * membership_->Nodes().size(), 8, 64)) {
    // Subscribed first, so no change falls between reading and listening.
    subscription_ = membership_->Subscribe(
        [this](const std::vector<NodeInfo>& nodes) { Refresh(nodes, /*heard=*/true); });
    Refresh(membership_->Nodes(), /*heard=*/false);
  }

  ~ClusterStore() override {
    membership_->Unsubscribe(subscription_);
    std::vector<LeaseId> pending;
    {
      std::lock_guard lock(leases_mu_);
      for (const auto& [id, w] : write_leases_) pending.push_back(id);
    }
    for (LeaseId id : pending) (void)Abort(id);
  }

  // Connects to every node; the namespace comes from the first that answers.
  Status Connect() {
    const std::shared_ptr<const View> view = Snapshot();
    if (view->conns.empty()) return Unavailable("the cluster has no live nodes");
    std::vector<Status> results(view->conns.size());
    std::vector<std::function<void()>> tasks;
    for (size_t i = 0; i < view->conns.size(); ++i) {
      tasks.emplace_back([&, i] { results[i] = Client(*view->conns[i]).status(); });
    }
    pool_.RunAll(std::move(tasks));
    for (const Status& st : results) {
      if (st.ok()) return Status::Ok();
    }
    return Unavailable("no node of the cluster answers: " + results.front().message());
  }

  Result<MatchResult> Match(const MatchRequest& req) override {
    Result<std::string> ns = Namespace();
    if (!ns.ok()) return ns.status();
    std::vector<ChainKey> keys;
    Result<MatchKeysRequest> by_keys = DeriveMatchKeys(*ns, req, &keys);
    if (!by_keys.ok()) return by_keys.status();
    return MatchKeys(*by_keys);
  }

  Result<MatchResult> MatchKeys(const MatchKeysRequest& req) override {
    STRATA_RETURN_IF_ERROR(CheckMatchOptions(req.block_tokens, req.lease_ttl, req.keys.size()));
    const std::shared_ptr<const View> view = Snapshot();
    const size_t n = req.keys.size();
    MatchResult out;
    out.model_id = req.model_id;
    out.block_tokens = req.block_tokens;
    out.prompt_blocks = static_cast<uint32_t>(n);
    out.prefix_key = req.root;
    if (n == 0) return out;
    if (view->conns.empty()) return Unavailable("the cluster has no live nodes");

    // The keys each node may hold, in prompt order.
    std::vector<std::vector<size_t>> asked(view->conns.size());
    std::vector<std::vector<size_t>> ranked(n);  // per block: replicas, best first
    const std::vector<bool> read_past = Down(*view, /*or_catching_up=*/true);
    for (size_t b = 0; b < n; ++b) {
      ranked[b] = view->placement.ReadReplicas(req.keys[b], view->replication, read_past);
      for (size_t node : ranked[b]) asked[node].push_back(b);
    }
    struct NodeAnswer {
      std::vector<ChainKey> keys;
      Result<MatchResult> result = Unavailable("not asked");
    };
    std::vector<NodeAnswer> answers(view->conns.size());
    std::vector<std::function<void()>> tasks;
    for (size_t i = 0; i < view->conns.size(); ++i) {
      if (asked[i].empty()) continue;
      tasks.emplace_back([&, i] {
        NodeAnswer& a = answers[i];
        for (size_t b : asked[i]) a.keys.push_back(req.keys[b]);
        MatchKeysRequest sub = req;
        sub.keys = a.keys;
        sub.independent_keys = true;
        a.result = OnNode(*view->conns[i], kReads,
                          [&](NodeClient& client) { return client.MatchKeys(sub); });
      });
    }
    pool_.RunAll(std::move(tasks));

    // Who holds what; a node that failed holds nothing.
    auto lease = std::make_shared<ReadLease>();
    std::vector<Nanos> part_expiry;  // beside lease->parts
    std::vector<std::vector<Holder>> holders(n);
    std::vector<std::pair<size_t, Holder>> swa_seen;  // (boundary, holder), per node
    Status first_error;
    size_t answered = 0;
    for (size_t i = 0; i < view->conns.size(); ++i) {
      if (asked[i].empty()) continue;
      Result<MatchResult>& r = answers[i].result;
      if (!r.ok()) {
        if (first_error.ok()) first_error = r.status();
        continue;
      }
      ++answered;
      const std::shared_ptr<NodeConn>& node = view->conns[i];
      if (r->lease != 0) {
        lease->parts.emplace_back(node, r->lease);
        part_expiry.push_back(r->lease_expiry);
      }
      // Hits come back in request order: walk the asked positions along.
      std::unordered_map<ChainKey, size_t> position;
      size_t at = 0;
      for (const BlockMatch& bm : r->blocks) {
        while (at < asked[i].size() && req.keys[asked[i][at]] != bm.key) ++at;
        if (at == asked[i].size()) break;  // not a key we asked for: ignore the rest
        const size_t b = asked[i][at];
        const size_t rank = static_cast<size_t>(std::find(ranked[b].begin(), ranked[b].end(), i) -
                                                ranked[b].begin());
        holders[b].push_back({node, r->lease, bm, rank});
        position[bm.key] = asked[i][at];
        ++at;
      }
      if (r->swa.has_value()) {
        auto it = position.find(r->swa->entry.key);
        if (it != position.end()) {
          const size_t boundary = it->second + 1;
          const std::vector<size_t>& order = ranked[boundary - 1];
          const auto rank =
              static_cast<size_t>(std::find(order.begin(), order.end(), i) - order.begin());
          swa_seen.emplace_back(boundary, Holder{node, r->lease, r->swa->entry, rank});
        }
      }
    }
    if (answered == 0) return first_error;

    size_t usable = 0;
    while (usable < n && !holders[usable].empty()) ++usable;
    // Replicas in placement order (every client reads a block from the same
    // node, so one copy stays hot), one in DRAM first.
    for (size_t b = 0; b < usable; ++b) {
      std::sort(holders[b].begin(), holders[b].end(),
                [](const Holder& x, const Holder& y) { return x.rank < y.rank; });
      std::stable_partition(holders[b].begin(), holders[b].end(),
                            [](const Holder& h) { return h.block.tier == Tier::kDram; });
      out.blocks.push_back(holders[b].front().block);
    }
    if (usable > 0) out.prefix_key = req.keys[usable - 1];
    // The deepest SWA state a node saw within the prefix (a node that saw a
    // deeper one, beyond the prefix, is not asked again), and its replicas.
    size_t swa_boundary = 0;
    for (const auto& [boundary, holder] : swa_seen) {
      if (boundary <= usable) swa_boundary = std::max(swa_boundary, boundary);
    }
    if (req.want_swa && swa_boundary > 0) {
      for (const auto& [boundary, holder] : swa_seen) {
        if (boundary == swa_boundary) lease->swa.push_back(holder);
      }
      std::sort(lease->swa.begin(), lease->swa.end(),
                [](const Holder& x, const Holder& y) { return x.rank < y.rank; });
      out.swa = SwaMatch{static_cast<uint32_t>(swa_boundary), lease->swa.front().block};
    }
    holders.resize(usable);
    // A node whose hits all lie past the prefix serves none of it: its
    // lease ends now instead of pinning those entries until it expires. The
    // lease lasts as long as the node leases it keeps.
    std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>> kept;
    std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>> unused;
    lease->expiry = std::numeric_limits<Nanos>::max();
    for (size_t p = 0; p < lease->parts.size(); ++p) {
      const auto& part = lease->parts[p];
      const auto serves = [&](const Holder& h) {
        return h.node == part.first && h.lease == part.second;
      };
      const bool used = std::any_of(holders.begin(), holders.end(),
                                    [&](const std::vector<Holder>& block) {
                                      return std::any_of(block.begin(), block.end(), serves);
                                    }) ||
                        std::any_of(lease->swa.begin(), lease->swa.end(), serves);
      if (used) {
        kept.push_back(part);
        lease->expiry = std::min(lease->expiry, part_expiry[p]);
      } else {
        unused.push_back(part);
      }
    }
    lease->parts = std::move(kept);
    ReleaseParts(unused);
    lease->holders = std::move(holders);
    if (!lease->parts.empty()) {
      out.lease = next_lease_.fetch_add(1);
      out.lease_expiry = lease->expiry;
      std::lock_guard lock(leases_mu_);
      if (read_leases_.size() >= kMaxTrackedLeases) {
        // Never released: the nodes end them by themselves.
        const Nanos now = SteadyClock().Now();
        std::erase_if(read_leases_, [&](const auto& kv) { return kv.second->expiry <= now; });
      }
      read_leases_.emplace(out.lease, std::move(lease));
    }
    return out;
  }

  FetchFuture Fetch(const FetchRequest& req) override { return FetchFuture::Ready(FetchNow(req)); }

  Result<Reservation> Reserve(const ModelId& model, std::span<const CommitBlock> blocks,
                              Nanos write_lease_ttl) override {
    if (blocks.empty() || blocks.size() > kMaxBlocksPerCall) {
      return InvalidArgument("reserve needs 1.." + std::to_string(kMaxBlocksPerCall) + " blocks");
    }
    // Checked here too: a block every replica refuses still gets a staging
    // buffer of its size (so Publish can report it), and the nodes check
    // only the blocks placed on them.
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (blocks[b].payload_bytes == 0 || blocks[b].payload_bytes > kMaxPayloadBytes) {
        return InvalidArgument("block " + std::to_string(b) + ": payload of " +
                               std::to_string(blocks[b].payload_bytes) + " bytes; must be 1.." +
                               std::to_string(kMaxPayloadBytes));
      }
    }
    const std::shared_ptr<const View> view = Snapshot();
    std::vector<WritePart> parts;
    std::vector<std::vector<CommitBlock>> node_blocks;
    std::vector<Status> no_replica(blocks.size());
    std::vector<std::shared_ptr<NodeConn>> displaced;
    PlanWrites(*view, blocks, &parts, &node_blocks, &no_replica, &displaced);

    std::vector<Result<Reservation>> results(parts.size(), Unavailable("not asked"));
    std::vector<std::function<void()>> tasks;
    for (size_t p = 0; p < parts.size(); ++p) {
      tasks.emplace_back([&, p] {
        results[p] = OnNode(*parts[p].node, kWrites, [&](NodeClient& client) {
          return client.ReserveUnstaged(model, node_blocks[p], write_lease_ttl);
        });
      });
    }
    AddProbes(displaced, &tasks);
    pool_.RunAll(std::move(tasks));

    auto lease = std::make_shared<WriteLease>();
    lease->present.assign(blocks.size(), 0);
    lease->failed = no_replica;
    lease->expiry = std::numeric_limits<Nanos>::max();
    std::vector<bool> reserved(blocks.size(), false), in_flight(blocks.size(), false);
    Status first_error;
    bool any_answer = false;
    for (size_t p = 0; p < parts.size(); ++p) {
      if (!results[p].ok()) {
        if (first_error.ok()) first_error = results[p].status();
        for (size_t b : parts[p].positions) {
          if (lease->failed[b].ok()) lease->failed[b] = results[p].status();
        }
        continue;
      }
      any_answer = true;
      parts[p].reservation = std::move(results[p]).value();
      const Reservation& r = parts[p].reservation;
      if (r.write_lease != 0) lease->expiry = std::min(lease->expiry, r.expiry);
      for (size_t j = 0; j < r.blocks.size() && j < parts[p].positions.size(); ++j) {
        const size_t b = parts[p].positions[j];
        switch (r.blocks[j].state) {
          case ReserveState::kReserved:
            reserved[b] = true;
            break;
          case ReserveState::kAlreadyPresent:
            ++lease->present[b];
            break;
          case ReserveState::kInFlight:
            in_flight[b] = true;
            break;
        }
      }
    }
    if (!any_answer) return first_error.ok() ? Unavailable("no writable node") : first_error;

    Reservation out;
    out.blocks.resize(blocks.size());
    bool needs_bytes = false;
    lease->staging.resize(blocks.size());
    for (size_t b = 0; b < blocks.size(); ++b) {
      ReservedBlock& rb = out.blocks[b];
      // A block no replica took is still written by the caller, so that
      // Publish can report why it failed, block by block.
      const bool all_failed =
          !reserved[b] && lease->present[b] == 0 && !in_flight[b] && !lease->failed[b].ok();
      if (reserved[b] || all_failed) {
        lease->staging[b].resize(blocks[b].payload_bytes);
        rb.buffer = std::span<std::byte>(lease->staging[b]);
        needs_bytes = true;
      } else {
        rb.state = lease->present[b] > 0 ? ReserveState::kAlreadyPresent : ReserveState::kInFlight;
      }
    }
    lease->parts = std::move(parts);
    if (needs_bytes) {
      const Nanos now = SteadyClock().Now();
      out.write_lease = next_lease_.fetch_add(1);
      out.expiry =
          lease->expiry == std::numeric_limits<Nanos>::max() ? now + call_timeout_ : lease->expiry;
      lease->reclaim_at = out.expiry + std::max<Nanos>(out.expiry - now, 0);
      // Reservations neither published nor aborted: the nodes dropped them.
      // Their staging is freed after the lock, not under it.
      std::vector<std::shared_ptr<WriteLease>> dropped;
      std::lock_guard lock(leases_mu_);
      std::erase_if(write_leases_, [&](auto& kv) {
        if (kv.second->reclaim_at > now) return false;
        dropped.push_back(std::move(kv.second));
        return true;
      });
      write_leases_.emplace(out.write_lease, std::move(lease));
    }
    return out;
  }

  Result<PublishResult> Publish(LeaseId write_lease, std::span<const uint64_t> checksums) override {
    std::shared_ptr<WriteLease> lease;
    {
      std::lock_guard lock(leases_mu_);
      auto it = write_leases_.find(write_lease);
      if (it != write_leases_.end()) {
        lease = std::move(it->second);
        write_leases_.erase(it);
      }
    }
    if (lease == nullptr) return NotFound("no reservation " + std::to_string(write_lease));
    const size_t n = lease->staging.size();
    if (checksums.size() != n) {
      AbortParts(*lease);
      return InvalidArgument("publish needs one checksum per reserved block: got " +
                             std::to_string(checksums.size()) + ", reservation has " +
                             std::to_string(n));
    }
    WriteTally tally(n);
    for (size_t b = 0; b < n; ++b) {
      for (uint32_t k = 0; k < lease->present[b]; ++k) tally.Ok(b);
      if (!lease->failed[b].ok()) tally.Fail(b, lease->failed[b]);
    }
    std::vector<Result<PublishResult>> results(lease->parts.size(), Unavailable("not asked"));
    std::vector<std::function<void()>> tasks;
    for (size_t p = 0; p < lease->parts.size(); ++p) {
      if (lease->parts[p].reservation.write_lease == 0) continue;  // nothing to write there
      tasks.emplace_back([&, p] {
        WritePart& part = lease->parts[p];
        std::vector<uint64_t> node_checksums;
        std::vector<std::span<const std::byte>> payloads;
        for (const size_t b : part.positions) {
          node_checksums.push_back(checksums[b]);
          payloads.emplace_back(lease->staging[b]);
        }
        bool asked = false;
        results[p] = OnNode(*part.node, kWrites, [&](NodeClient& client) {
          asked = true;
          return client.PublishFrom(part.reservation.write_lease, payloads, node_checksums);
        });
        // A node skipped since its reservation gets no publish: its
        // reservation ends now rather than hold the space to its expiry
        // (the cluster lease is gone, so no one could abort it later).
        if (!asked) ReleaseParts({{part.node, part.reservation.write_lease}});
      });
    }
    pool_.RunAll(std::move(tasks));
    for (size_t p = 0; p < lease->parts.size(); ++p) {
      const WritePart& part = lease->parts[p];
      if (part.reservation.write_lease == 0) continue;
      Tally(part.positions, part.reservation, results[p], &tally);
    }
    return tally.Result();
  }

  Result<PublishResult> Commit(const ModelId& model,
                               std::span<const CommitPayload> payloads) override {
    if (payloads.empty() || payloads.size() > kMaxBlocksPerCall) {
      return InvalidArgument("commit needs 1.." + std::to_string(kMaxBlocksPerCall) + " blocks");
    }
    Result<std::vector<CommitBlock>> checked = CommitBlocksOf(payloads);
    if (!checked.ok()) return checked.status();
    const std::vector<CommitBlock>& blocks = *checked;
    const std::shared_ptr<const View> view = Snapshot();
    std::vector<WritePart> parts;
    std::vector<std::vector<CommitBlock>> node_blocks;
    std::vector<Status> no_replica(blocks.size());
    std::vector<std::shared_ptr<NodeConn>> displaced;
    PlanWrites(*view, blocks, &parts, &node_blocks, &no_replica, &displaced);

    std::vector<Result<PublishResult>> results(parts.size(), Unavailable("not asked"));
    std::vector<std::function<void()>> tasks;
    for (size_t p = 0; p < parts.size(); ++p) {
      tasks.emplace_back([&, p] {
        std::vector<CommitPayload> node_payloads;
        for (size_t j = 0; j < parts[p].positions.size(); ++j) {
          CommitPayload c = payloads[parts[p].positions[j]];
          c.block = node_blocks[p][j];
          node_payloads.push_back(c);
        }
        results[p] = OnNode(*parts[p].node, kWrites, [&](NodeClient& client) {
          return client.Commit(model, node_payloads);
        });
      });
    }
    AddProbes(displaced, &tasks);
    pool_.RunAll(std::move(tasks));

    WriteTally tally(blocks.size());
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (!no_replica[b].ok()) tally.Fail(b, no_replica[b]);
    }
    bool any_answer = false;
    Status first_error;
    for (size_t p = 0; p < parts.size(); ++p) {
      if (results[p].ok()) {
        any_answer = true;
      } else if (first_error.ok()) {
        first_error = results[p].status();
      }
      Tally(parts[p].positions, std::nullopt, results[p], &tally);
    }
    if (!any_answer) return first_error.ok() ? Unavailable("no writable node") : first_error;
    return tally.Result();
  }

  Status RenewLease(LeaseId lease_id, Nanos ttl) override {
    if (ttl < 0 || ttl > kMaxLeaseTtl) return InvalidArgument("lease ttl must be in [0, 10m]");
    std::shared_ptr<ReadLease> read;
    std::shared_ptr<WriteLease> write;
    {
      std::lock_guard lock(leases_mu_);
      if (auto it = read_leases_.find(lease_id); it != read_leases_.end()) read = it->second;
      if (auto it = write_leases_.find(lease_id); it != write_leases_.end()) write = it->second;
    }
    std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>> parts;
    if (read != nullptr) parts = read->parts;
    if (write != nullptr) {
      for (const WritePart& p : write->parts) {
        if (p.reservation.write_lease != 0) parts.emplace_back(p.node, p.reservation.write_lease);
      }
    }
    if (parts.empty()) return LeaseExpired("lease " + std::to_string(lease_id) + " is not live");
    const Nanos sent = SteadyClock().Now();
    std::vector<Status> results(parts.size());
    std::vector<std::function<void()>> tasks;
    for (size_t i = 0; i < parts.size(); ++i) {
      tasks.emplace_back([&, i] {
        results[i] = OnNode(*parts[i].first, kWrites, [&](NodeClient& client) {
          return client.RenewLease(parts[i].second, ttl);
        });
      });
    }
    pool_.RunAll(std::move(tasks));
    if (write != nullptr) {
      // Every replica that reserved must still hold its space.
      for (const Status& st : results) STRATA_RETURN_IF_ERROR(st);
      // With ttl 0 each node applies its own default, which we do not
      // know: assume the longest a lease may have.
      const Nanos held = ttl > 0 ? ttl : kMaxLeaseTtl;
      std::lock_guard lock(leases_mu_);
      write->reclaim_at = std::max(write->reclaim_at, sent + 2 * held);
      return Status::Ok();
    }
    // A read lease survives while every block of the prefix keeps at least
    // one replica whose lease renewed; fetches then skip the others.
    std::vector<LeaseId> lost;
    Status first_error;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!results[i].ok()) {
        lost.push_back(parts[i].second);
        if (first_error.ok()) first_error = results[i];
      }
    }
    auto renewed = std::make_shared<ReadLease>(*read);
    // Only prunes our table; the nodes keep their own clocks (0: their
    // default of 10 s).
    renewed->expiry = sent + (ttl > 0 ? ttl : kDefaultReadLeaseTtl);
    auto gone = [&](const Holder& h) {
      return std::find(lost.begin(), lost.end(), h.lease) != lost.end();
    };
    for (std::vector<Holder>& hs : renewed->holders) std::erase_if(hs, gone);
    std::erase_if(renewed->swa, gone);
    // Parts dropped here are never released later: end them now (a part
    // that only timed out or was skipped may still hold its pins).
    std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>> dropped;
    std::erase_if(renewed->parts, [&](const auto& part) {
      const bool drop = std::find(lost.begin(), lost.end(), part.second) != lost.end();
      if (drop) dropped.push_back(part);
      return drop;
    });
    ReleaseParts(dropped);
    const bool whole = std::all_of(renewed->holders.begin(), renewed->holders.end(),
                                   [](const std::vector<Holder>& hs) { return !hs.empty(); });
    std::lock_guard lock(leases_mu_);
    if (auto it = read_leases_.find(lease_id); it != read_leases_.end()) it->second = renewed;
    return whole ? Status::Ok() : first_error;
  }

  Status Abort(LeaseId lease_id) override {
    std::shared_ptr<ReadLease> read;
    std::shared_ptr<WriteLease> write;
    {
      std::lock_guard lock(leases_mu_);
      if (auto it = read_leases_.find(lease_id); it != read_leases_.end()) {
        read = std::move(it->second);
        read_leases_.erase(it);
      }
      if (auto it = write_leases_.find(lease_id); it != write_leases_.end()) {
        write = std::move(it->second);
        write_leases_.erase(it);
      }
    }
    if (write != nullptr) AbortParts(*write);
    if (read != nullptr) AbortParts(read->parts);
    return Status::Ok();  // unknown or ended leases are fine: abort is idempotent
  }

  // A read lease ends on every node without a round trip (each node client
  // sends it with its next call); anything else is an Abort.
  void Release(LeaseId lease_id) override {
    std::shared_ptr<ReadLease> read;
    {
      std::lock_guard lock(leases_mu_);
      if (auto it = read_leases_.find(lease_id); it != read_leases_.end()) {
        read = std::move(it->second);
        read_leases_.erase(it);
      }
    }
    if (read == nullptr) {
      (void)Abort(lease_id);
      return;
    }
    ReleaseParts(read->parts);
  }

 private:
  std::shared_ptr<const View> Snapshot() const {
    std::lock_guard lock(view_mu_);
    return view_;
  }

  // Rebuilds the view from a node list and the current settings; links to
  // nodes that stay are kept. `heard`: the list comes from a listener call,
  // else from the constructor, whose list loses to any listener call that
  // got in first (it may be older). Serialised; the membership is never
  // asked for its nodes under refresh_mu_ (a membership may call listeners
  // under its own lock).
  void Refresh(const std::vector<NodeInfo>& nodes, bool heard) {
    std::lock_guard refresh(refresh_mu_);
    if (!heard && heard_) return;
    heard_ = heard_ || heard;
    auto view = std::make_shared<View>(nodes);
    view->replication =
        replication_option_ != 0
            ? replication_option_
            : std::clamp<uint32_t>(membership_->Settings().replication_factor, 1, kMaxReplication);
    const std::shared_ptr<const View> old = Snapshot();
    for (const NodeInfo& info : view->placement.nodes()) {
      std::shared_ptr<NodeLink> link;
      if (old != nullptr) {
        for (const std::shared_ptr<NodeConn>& c : old->conns) {
          if (c->info.node_id == info.node_id && c->info.address == info.address) link = c->link;
        }
      }
      if (link == nullptr) link = std::make_shared<NodeLink>();
      view->conns.push_back(std::make_shared<NodeConn>(info, std::move(link)));
    }
    std::lock_guard lock(view_mu_);
    view_ = std::move(view);
  }

  // Unavailable on a read means the node is not serving; on a write it may
  // be a draining node refusing new blocks, which answers all the same.
  static constexpr bool kReads = true;
  static constexpr bool kWrites = false;

  // The node's client, connected on first use; refused while the node is
  // being skipped, except for a probe once the wait is over. `probe` false:
  // only an existing client, whatever the node's state (for work that is
  // queued, not sent).
  Result<std::shared_ptr<NodeClient>> Client(const NodeConn& node, bool probe = true) {
    NodeLink& link = *node.link;
    std::unique_lock lock(link.mu);
    // Named only on the way out with an error: the usual call returns the client.
    auto who = [&] { return "node " + node.info.node_id + " (" + node.info.address + ")"; };
    if (!probe) {
      if (link.client != nullptr) return link.client;
      return Unavailable(who() + " is not connected");
    }
    const Nanos now = SteadyClock().Now();
    if (link.skip_for > 0) {
      if (now < link.skip_until) {
        return Unavailable(
            who() + " is skipped for another " +
            std::to_string((std::max<Nanos>(link.skip_until - now, 0) + 999'999) / 1'000'000) +
            " ms: " + link.last_error.message());
      }
      link.skip_until = now + link.skip_for;  // this call probes; the others wait for it
    }
    if (link.client != nullptr) return link.client;
    if (link.connecting) return Unavailable(who() + " is being connected");
    link.connecting = true;
    lock.unlock();  // connecting may take a call deadline
    ClientOptions options = node_options_;
    options.timeout = call_timeout_;
    Result<std::unique_ptr<NodeClient>> client = ConnectNode(node.info.address, options);
    Status refused;
    if (client.ok()) {
      std::lock_guard ns_lock(ns_mu_);
      if (ns_.empty()) ns_ = (*client)->caller_namespace();
      if (ns_ != (*client)->caller_namespace()) {
        refused = Internal(who() + " maps this token to another namespace than its peers");
      }
    } else {
      refused = Status(client.status().code(), who() + ": " + client.status().message());
    }
    lock.lock();
    link.connecting = false;
    if (!refused.ok()) {
      StrikeLocked(link, refused, SteadyClock().Now());
      return refused;
    }
    link.client = std::move(client).value();
    return link.client;
  }

  // Runs `call` with the node's client, unless the node is being skipped,
  // and learns from the outcome whether the node answers.
  template <typename Call>
  std::invoke_result_t<Call&, NodeClient&> OnNode(const NodeConn& node, bool reads, Call&& call) {
    using Out = std::invoke_result_t<Call&, NodeClient&>;
    const Nanos started = SteadyClock().Now();
    Result<std::shared_ptr<NodeClient>> client = Client(node);
    if (!client.ok()) return Out(client.status());
    Out out = call(**client);
    if constexpr (std::is_same_v<Out, Status>) {
      Heard(node, reads, out, started);
    } else {
      Heard(node, reads, out.status(), started);
    }
    return out;
  }

  // A call to the node that started at `started` ended with `st`: past its
  // deadline, or a read refused as unavailable, is not answering; a write
  // refused as unavailable says nothing (a draining node refuses writes
  // and answers); anything else is an answer.
  static void Heard(const NodeConn& node, bool reads, const Status& st, Nanos started) {
    const bool silent = st.code() == StatusCode::kDeadlineExceeded ||
                        (reads && st.code() == StatusCode::kUnavailable);
    if (!silent && st.code() == StatusCode::kUnavailable) return;
    NodeLink& link = *node.link;
    std::lock_guard lock(link.mu);
    const Nanos now = SteadyClock().Now();
    if (!silent) {
      if (link.skip_for > 0) {
        link.skip_for = 0;
        link.cleared_at = now;
        // A short outage does not cut the catch-up of a longer one short.
        link.catch_up_until = std::max(
            link.catch_up_until, now + std::clamp(now - link.down_since, kMinCatchUp, kMaxCatchUp));
      }
      return;
    }
    // Calls that were in flight when the node was struck, or when it
    // answered again, fail late: not news.
    if (started < link.cleared_at || (link.skip_for > 0 && started < link.struck_at)) return;
    StrikeLocked(link, Status(st.code(), "not answering (" + st.message() + ")"), now);
  }

  static void StrikeLocked(NodeLink& link, const Status& st, Nanos now) {
    if (link.skip_for == 0) link.down_since = now;
    link.skip_for = link.skip_for == 0 ? kFirstSkip : std::min(2 * link.skip_for, kMaxSkip);
    link.skip_until = now + link.skip_for;
    link.struck_at = now;
    link.last_error = st;
  }

  // Per node of the view: not answering (being skipped, or probed). Such a
  // node takes no new blocks until it answers again. `or_catching_up`: also
  // a node back from an outage for less than its catch-up time, which reads
  // look past as they did while it was down.
  static std::vector<bool> Down(const View& view, bool or_catching_up = false) {
    const Nanos now = SteadyClock().Now();
    std::vector<bool> down(view.conns.size(), false);
    for (size_t i = 0; i < view.conns.size(); ++i) {
      NodeLink& link = *view.conns[i]->link;
      std::lock_guard lock(link.mu);
      down[i] = link.skip_for > 0 || (or_catching_up && now < link.catch_up_until);
    }
    return down;
  }

  // Probes of the down nodes a write passed over, run alongside it: a
  // client that only writes would otherwise never learn that they answer
  // again (reads ask down nodes, and probe them, on their own). Refused at
  // once unless a node's wait is over.
  void AddProbes(const std::vector<std::shared_ptr<NodeConn>>& displaced,
                 std::vector<std::function<void()>>* tasks) {
    for (const std::shared_ptr<NodeConn>& node : displaced) {
      tasks->emplace_back([this, node] {
        // An empty match: a read that changes nothing on the node.
        MatchKeysRequest ping;
        ping.block_tokens = kMinBlockTokens;
        ping.want_swa = false;
        (void)OnNode(*node, kReads, [&](NodeClient& client) { return client.MatchKeys(ping); });
      });
    }
  }

  Result<std::string> CallerNamespace() override { return Namespace(); }

  Result<std::string> Namespace() {
    {
      std::lock_guard lock(ns_mu_);
      if (!ns_.empty()) return ns_;
    }
    STRATA_RETURN_IF_ERROR(Connect());
    std::lock_guard lock(ns_mu_);
    return ns_;
  }

  // Splits a batch over the write replicas of its blocks. A block keeps its
  // parent only where the parent goes in the same batch to the same node:
  // elsewhere the node may never have seen the parent (it lives on other
  // nodes), and the cluster's prefix is checked across nodes at match time.
  // `displaced`: the down nodes that would have taken some of the blocks.
  void PlanWrites(const View& view, std::span<const CommitBlock> blocks,
                  std::vector<WritePart>* parts, std::vector<std::vector<CommitBlock>>* node_blocks,
                  std::vector<Status>* no_replica,
                  std::vector<std::shared_ptr<NodeConn>>* displaced) const {
    std::vector<int> part_of(view.conns.size(), -1);
    const std::vector<bool> down = Down(view);
    const bool any_down = std::find(down.begin(), down.end(), true) != down.end();
    std::vector<bool> was_displaced(view.conns.size(), false);
    // Per node, the keys placed there so far in this batch.
    std::vector<std::vector<ChainKey>> placed(view.conns.size());
    for (size_t b = 0; b < blocks.size(); ++b) {
      std::vector<size_t> replicas =
          view.placement.WriteReplicas(blocks[b].key, view.replication, down);
      if (any_down) {
        for (size_t n : view.placement.ReadReplicas(blocks[b].key, view.replication, down)) {
          if (down[n] && !was_displaced[n]) {
            was_displaced[n] = true;
            displaced->push_back(view.conns[n]);
          }
        }
      }
      // With every writable node down, the block goes where it belongs:
      // refused there at once, saying why.
      if (replicas.empty()) {
        replicas = view.placement.WriteReplicas(blocks[b].key, view.replication);
      }
      if (replicas.empty()) {
        (*no_replica)[b] = Unavailable("no node takes writes (all draining or gone)");
        continue;
      }
      for (size_t node : replicas) {
        if (part_of[node] < 0) {
          part_of[node] = static_cast<int>(parts->size());
          parts->push_back(WritePart{view.conns[node], {}, {}});
          node_blocks->emplace_back();
        }
        const auto p = static_cast<size_t>(part_of[node]);
        CommitBlock cb = blocks[b];
        if (cb.parent.has_value() &&
            std::find(placed[node].begin(), placed[node].end(), *cb.parent) == placed[node].end()) {
          cb.parent.reset();
        }
        if (cb.kind == StateKind::kGlobalKv) placed[node].push_back(cb.key);
        (*parts)[p].positions.push_back(b);
        (*node_blocks)[p].push_back(cb);
      }
    }
  }

  // Adds one node's per-block answer to the tally.
  static void Tally(const std::vector<size_t>& positions, const std::optional<Reservation>& r,
                    const Result<PublishResult>& result, WriteTally* tally) {
    for (size_t j = 0; j < positions.size(); ++j) {
      const size_t b = positions[j];
      if (!result.ok()) {
        tally->Fail(b, result.status());
      } else if (j < result->blocks.size() && result->blocks[j].ok()) {
        // Publish answers for every block of the reservation: OK for blocks
        // it had already (counted at reserve time).
        if (!r.has_value() || r->blocks[j].state == ReserveState::kReserved) tally->Ok(b);
      } else if (j < result->blocks.size()) {
        tally->Fail(b, result->blocks[j]);
      } else if (!r.has_value()) {
        tally->Ok(b);  // a commit with nothing to write answers with no blocks
      }
    }
  }

  void AbortParts(const WriteLease& lease) {
    std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>> parts;
    for (const WritePart& p : lease.parts) {
      if (p.reservation.write_lease != 0) parts.emplace_back(p.node, p.reservation.write_lease);
    }
    AbortParts(parts);
  }

  // Ends read leases on their nodes without a round trip: each node
  // client queues the release for its next call or its flusher, so even a
  // node being skipped takes it.
  void ReleaseParts(const std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>>& parts) {
    for (const auto& [node, lease] : parts) {
      Result<std::shared_ptr<NodeClient>> client = Client(*node, /*probe=*/false);
      if (client.ok()) (*client)->Release(lease);  // else it ends at its expiry
    }
  }

  // A node being skipped is not asked: its client queues the lease's end
  // (the node aborts released leases, write leases too) for its next call
  // or its flusher, which no skip holds back. Else the node would keep the
  // space or the pins until the lease expired.
  void AbortParts(const std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>>& parts) {
    std::vector<std::function<void()>> tasks;
    tasks.reserve(parts.size());
    for (const auto& [node, lease] : parts) {
      tasks.emplace_back([&node = node, lease = lease, this] {
        bool asked = false;
        (void)OnNode(*node, kWrites, [&](NodeClient& client) {
          asked = true;
          return client.Abort(lease);
        });
        if (!asked) ReleaseParts({{node, lease}});
      });
    }
    pool_.RunAll(std::move(tasks));
  }

  FetchOutcome FetchNow(const FetchRequest& req) {
    FetchOutcome out;
    bool want_swa = false;
    out.status = CheckFetchRequest(req, &want_swa);
    if (!out.status.ok()) return out;
    const MatchResult& match = *req.match;
    const size_t n = req.block_buffers.size();
    if (n == 0 && !want_swa) return out;
    const Nanos deadline = SteadyClock().Now() + 3 * call_timeout_;

    // Replicas are only good under their leases: take them if the match did not.
    std::shared_ptr<const ReadLease> lease;
    LeaseId own_lease = 0;
    if (match.lease != 0) {
      std::lock_guard lock(leases_mu_);
      if (auto it = read_leases_.find(match.lease); it != read_leases_.end()) lease = it->second;
    }
    if (lease == nullptr && match.lease != 0) {
      // The match's lease was released or expired: as a node would, say so
      // rather than lease the blocks again behind the caller's back.
      out.status = LeaseExpired("lease " + std::to_string(match.lease) +
                                " is not live (expired or released)");
      return out;
    }
    if (lease == nullptr) {
      std::vector<ChainKey> keys;
      for (size_t b = 0; b < n; ++b) keys.push_back(match.blocks[b].key);
      MatchKeysRequest again;
      again.model_id = match.model_id;
      again.root = match.prefix_key;
      again.keys = keys;
      again.block_tokens = match.block_tokens == 0 ? 1 : match.block_tokens;
      again.want_swa = want_swa;
      again.take_lease = true;
      Result<MatchResult> r = MatchKeys(again);
      if (!r.ok()) {
        out.status = r.status();
        return out;
      }
      own_lease = r->lease;
      std::lock_guard lock(leases_mu_);
      if (auto it = read_leases_.find(own_lease); it != read_leases_.end()) lease = it->second;
    }
    if (lease == nullptr) {
      out.status = NotFound("block 0 is no longer stored");
      return out;
    }
    FetchFromReplicas(req, match, *lease, n, want_swa, deadline, out);
    if (own_lease != 0) (void)Abort(own_lease);
    return out;
  }

  // Reads block b from its replicas in turn, all blocks of a round in
  // parallel (one node call per node), until every block arrived, a block
  // ran out of replicas, or the deadline leaves no room for another round.
  void FetchFromReplicas(const FetchRequest& req, const MatchResult& match, const ReadLease& lease,
                         size_t n, bool want_swa, Nanos deadline, FetchOutcome& out) {
    // A replica serves a block only if it reported the very block matched.
    std::vector<std::vector<const Holder*>> candidates(n);
    for (size_t b = 0; b < n && b < lease.holders.size(); ++b) {
      for (const Holder& h : lease.holders[b]) {
        if (h.block.key == match.blocks[b].key && h.block.checksum == match.blocks[b].checksum &&
            h.block.payload_bytes == match.blocks[b].payload_bytes) {
          candidates[b].push_back(&h);
        }
      }
    }
    std::vector<const Holder*> swa_candidates;
    for (const Holder& h : lease.swa) {
      if (want_swa && h.block.key == match.swa->entry.key &&
          h.block.checksum == match.swa->entry.checksum) {
        swa_candidates.push_back(&h);
      }
    }
    size_t next_swa = 0;
    // A block retried after some of its groups were reported ready lands in
    // scratch: the caller may be reading those groups already, so only the
    // groups not yet reported are copied over once the block verified.
    std::vector<std::vector<std::byte>> scratch(n);
    std::vector<size_t> next(n, 0);  // next candidate to try, per block
    std::vector<bool> done(n, false);
    std::vector<Status> why(n);
    bool swa_done = false;
    Status swa_why = NotFound("SWA state is no longer stored");
    FetchEvents events(req.on_event, n);

    for (;;) {
      // The prefix cannot reach past a block with no replica left.
      size_t reachable = n;
      for (size_t b = 0; b < n; ++b) {
        if (!done[b] && next[b] >= candidates[b].size()) {
          reachable = b;
          break;
        }
      }
      // One sub-fetch per node, of the blocks it serves this round.
      struct SubFetch {
        std::shared_ptr<NodeConn> node;
        MatchResult match;
        std::vector<size_t> positions;
        std::vector<std::span<std::byte>> buffers;
        bool swa = false;
        FetchOutcome outcome;
      };
      std::vector<SubFetch> subs;
      auto sub_for = [&](const Holder& h) -> SubFetch& {
        for (SubFetch& s : subs) {
          if (s.node == h.node && s.match.lease == h.lease) return s;
        }
        SubFetch& s = subs.emplace_back();
        s.node = h.node;
        s.match.model_id = match.model_id;
        s.match.block_tokens = match.block_tokens;
        s.match.lease = h.lease;
        s.match.lease_expiry = lease.expiry;
        return s;
      };
      for (size_t b = 0; b < reachable; ++b) {
        if (done[b]) continue;
        const Holder& h = *candidates[b][next[b]++];
        SubFetch& s = sub_for(h);
        s.match.blocks.push_back(h.block);
        s.positions.push_back(b);
        if (events.AnyGroup(b)) scratch[b].resize(req.block_buffers[b].size());
        s.buffers.push_back(scratch[b].empty() ? req.block_buffers[b] : scratch[b]);
      }
      // Never again into a buffer the caller may be reading.
      if (!swa_done && !events.SwaReported() && next_swa < swa_candidates.size()) {
        const Holder& h = *swa_candidates[next_swa++];
        SubFetch& s = sub_for(h);
        // Boundary 0: the node fetches it whatever its share of the prefix
        // (CheckFetchRequest asks for the blocks up to the boundary);
        // whether it belongs to the usable prefix is decided here.
        s.match.swa = SwaMatch{0, h.block};
        s.swa = true;
      }
      if (subs.empty()) break;
      std::vector<std::function<void()>> tasks;
      tasks.reserve(subs.size());
      for (SubFetch& s : subs) {
        tasks.emplace_back([&s, &req, &events, &scratch, this] {
          FetchRequest sub;
          sub.match = &s.match;
          sub.block_buffers = s.buffers;
          if (s.swa) sub.swa_buffer = req.swa_buffer;
          sub.on_event = [&s, &events, &scratch](const FetchEvent& e) {
            if (e.type == FetchEvent::Type::kSwaReady) {
              if (s.swa) events.Swa();
              return;
            }
            // Blocks going to scratch are reported once copied over.
            if (e.block >= s.positions.size() || !scratch[s.positions[e.block]].empty()) return;
            if (e.type == FetchEvent::Type::kGroupReady)
              events.Group(s.positions[e.block], e.group);
            if (e.type == FetchEvent::Type::kBlockReady) events.Block(s.positions[e.block]);
          };
          // The outcome's status, or why the node was not asked.
          s.outcome.status = OnNode(*s.node, kReads, [&](NodeClient& client) {
            s.outcome = client.Fetch(sub).Wait();
            return s.outcome.status;
          });
        });
      }
      pool_.RunAll(std::move(tasks));
      for (const SubFetch& s : subs) {
        for (size_t j = 0; j < s.positions.size(); ++j) {
          const size_t b = s.positions[j];
          if (j < s.outcome.blocks_ready) {
            done[b] = true;
            if (!scratch[b].empty()) {
              if (Status st = CopyUnreportedGroups(scratch[b], req.block_buffers[b], b, events);
                  !st.ok()) {
                done[b] = false;
                why[b] = st;
              }
              scratch[b] = {};
            }
          } else {
            why[b] = s.outcome.status.ok() ? Internal("block did not complete") : s.outcome.status;
          }
        }
        if (s.swa) {
          swa_done = s.outcome.swa_ready;
          if (!swa_done) {
            swa_why =
                s.outcome.status.ok() ? NotFound("SWA state did not arrive") : s.outcome.status;
          }
        }
      }
      size_t missing = n;
      for (size_t b = 0; b < n; ++b) {
        if (!done[b]) {
          missing = b;
          break;
        }
      }
      const bool swa_left = !swa_done && !events.SwaReported() && next_swa < swa_candidates.size();
      if (missing == n && !swa_left) break;
      if (SteadyClock().Now() + call_timeout_ > deadline) {
        if (missing < n) {
          why[missing] = DeadlineExceeded("no time left to try another replica (" +
                                          why[missing].message() + ")");
        }
        break;
      }
    }
    size_t usable = 0;
    while (usable < n && done[usable]) ++usable;
    out.blocks_ready = static_cast<uint32_t>(usable);
    for (size_t b = 0; b < usable; ++b) out.bytes += match.blocks[b].payload_bytes;
    if (usable < n) {
      const Status& st = why[usable];
      out.status = Status(st.ok() ? StatusCode::kNotFound : st.code(),
                          "block " + std::to_string(usable) + ": " +
                              (st.ok() ? std::string("no replica holds it") : st.message()));
    }
    if (want_swa) {
      out.swa_ready = swa_done && usable >= match.swa->boundary_blocks;
      if (out.swa_ready) {
        out.bytes += match.swa->entry.payload_bytes;
      } else if (out.status.ok()) {  // arrived, it falls only with the prefix, already reported
        out.status = Status(swa_why.code(), "SWA state: " + swa_why.message());
      }
    }
    events.Finish(usable, out.swa_ready);
  }

  // Copies from a verified `scratch` payload into `dest` the layer groups of
  // `block` not reported ready yet, and reports them. The header is in place
  // already: a reported group means it was verified there, and it hashes to
  // the same entry checksum as the scratch copy.
  static Status CopyUnreportedGroups(std::span<const std::byte> scratch, std::span<std::byte> dest,
                                     size_t block, FetchEvents& events) {
    Result<PayloadHeader> header = ParsePayloadHeader(scratch);
    if (!header.ok()) return header.status();
    for (uint32_t g = 0; g < header->groups.size(); ++g) {
      if (events.HasGroup(block, g)) continue;
      const GroupExtent& e = header->groups[g];
      std::memcpy(dest.data() + e.offset, scratch.data() + e.offset, e.length);
      events.Group(block, g);
    }
    events.Block(block);
    return Status::Ok();
  }

  const std::shared_ptr<Membership> membership_;
  const ClientOptions node_options_;
  const uint32_t replication_option_;
  const Nanos call_timeout_;  // of one node call: a third of the caller's timeout
  TaskPool pool_;
  uint64_t subscription_ = 0;

  std::mutex refresh_mu_;
  bool heard_ = false;  // a listener call refreshed the view (refresh_mu_)
  mutable std::mutex view_mu_;
  std::shared_ptr<const View> view_;

  std::mutex ns_mu_;
  std::string ns_;  // the caller's namespace, as the nodes map the token

  std::atomic<LeaseId> next_lease_{1};
  std::mutex leases_mu_;
  std::unordered_map<LeaseId, std::shared_ptr<ReadLease>> read_leases_;
  std::unordered_map<LeaseId, std::shared_ptr<WriteLease>> write_leases_;
};

}  // namespace

Result<std::vector<NodeInfo>> ParseNodeList(std::string_view list) {
  std::vector<NodeInfo> nodes;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string address(list.substr(start, comma - start));
    const size_t colon = address.rfind(':');
    if (address.empty() || colon == std::string::npos || colon == 0 ||
        colon + 1 == address.size() || address.find('/') != std::string::npos ||
        address.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return InvalidArgument("expected host:port in node list '" + std::string(list) + "', got '" +
                             address + "'");
    }
    for (const NodeInfo& n : nodes) {
      if (n.address == address) return InvalidArgument("node " + address + " is listed twice");
    }
    nodes.push_back({address, address, false});
    start = comma + 1;
  }
  return nodes;
}

Result<std::unique_ptr<Store>> OpenClusterStore(std::shared_ptr<Membership> membership,
                                                const ClientOptions& options) {
  if (membership == nullptr) return InvalidArgument("no membership");
  if (options.timeout <= 0) return InvalidArgument("timeout must be positive");
  if (options.replication_factor > kMaxReplication) {
    return InvalidArgument("replication factor above " + std::to_string(kMaxReplication));
  }
  auto store =
      std::make_unique<ClusterStore>(std::move(membership), options, options.replication_factor,
                                     std::max<Nanos>(options.timeout / 3, 1));
  STRATA_RETURN_IF_ERROR(store->Connect());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace strata
