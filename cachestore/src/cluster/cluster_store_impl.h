// ClusterStore: the cluster client's class, shared by the files of
// cachestore/src/cluster/ that implement it (one concept each).
//
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
#pragma once

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
#include "util/mutex.h"

namespace strata {

inline constexpr Nanos kFirstSkip = Seconds(1);
inline constexpr Nanos kMaxSkip = Seconds(8);
// After an outage of length d, reads also ask the node ranked next for the
// node's blocks for d, within these bounds: its share of what was written
// meanwhile went there, and is still there.
inline constexpr Nanos kMinCatchUp = Seconds(10);
inline constexpr Nanos kMaxCatchUp = Minutes(10);
// A node's default read lease TTL (CacheStoreOptions), for a renewal with ttl 0.
inline constexpr Nanos kDefaultReadLeaseTtl = Seconds(10);
inline constexpr size_t kMaxTrackedLeases = 4096;
inline constexpr uint32_t kMaxReplication = 16;

// Our connection to one node and what we learned of its answering. The
// client is created on first use; both are kept while the node stays in the
// membership (across changes of its drain flag).
struct NodeLink {
  Mutex mu;
  std::shared_ptr<NodeClient> client ABSL_GUARDED_BY(mu);
  bool connecting ABSL_GUARDED_BY(mu) = false;  // one caller connects, without holding mu
  // Not answering: calls skip the node until skip_until, when one goes
  // through as a probe (and moves skip_until on by skip_for, so the others
  // keep skipping while it runs). skip_for 0: the node answers.
  Nanos skip_for ABSL_GUARDED_BY(mu) = 0;
  Nanos skip_until ABSL_GUARDED_BY(mu) = 0;
  Nanos struck_at ABSL_GUARDED_BY(mu) = 0;   // calls started before a strike are old news...
  Nanos cleared_at ABSL_GUARDED_BY(mu) = 0;  // ...and so are those started before it answered again
  Nanos down_since ABSL_GUARDED_BY(mu) = 0;  // the first strike of the latest outage
  Nanos catch_up_until ABSL_GUARDED_BY(mu) = 0;
  Status last_error ABSL_GUARDED_BY(mu);
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
    MutexLock lock(mu_);
    std::vector<bool>& g = groups_[block];
    if (g.size() <= group) g.resize(group + 1, false);
    if (g[group]) return;
    g[group] = true;
    sink_({FetchEvent::Type::kGroupReady, static_cast<uint32_t>(block), group});
    Announce(groups_.size());
  }

  void Block(size_t block) {
    if (!sink_) return;
    MutexLock lock(mu_);
    sink_({FetchEvent::Type::kBlockReady, static_cast<uint32_t>(block), 0});
  }

  // Whether any / this group of `block` was reported ready: the caller may
  // be reading it already, so it must not be written again.
  bool AnyGroup(size_t block) {
    if (!sink_) return false;
    MutexLock lock(mu_);
    for (bool g : groups_[block]) {
      if (g) return true;
    }
    return false;
  }
  bool HasGroup(size_t block, uint32_t group) {
    MutexLock lock(mu_);
    return group < groups_[block].size() && groups_[block][group];
  }

  // The SWA state verified on the node that served it: reported at once,
  // ahead of the bodies (a worker needs it before layer 0), and once.
  void Swa() {
    if (!sink_) return;
    MutexLock lock(mu_);
    if (swa_reported_) return;
    swa_reported_ = true;
    sink_({FetchEvent::Type::kSwaReady, 0, 0});
  }
  // Whether the caller may be reading the SWA buffer already: it must not
  // be written again.
  bool SwaReported() {
    MutexLock lock(mu_);
    return swa_reported_;
  }

  void Finish(size_t usable, bool swa_ready) {
    if (!sink_) return;
    MutexLock lock(mu_);
    Announce(usable);
    if (swa_ready && !swa_reported_) sink_({FetchEvent::Type::kSwaReady, 0, 0});
  }

 private:
  void Announce(size_t prefix) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (prefix > 0) {
      for (size_t b = 0; b < prefix; ++b) {
        if (announced_ >= groups_[b].size() || !groups_[b][announced_]) return;
      }
      sink_({FetchEvent::Type::kLayerGroupDone, static_cast<uint32_t>(prefix), announced_});
      ++announced_;
    }
  }

  const std::function<void(const FetchEvent&)>& sink_;
  Mutex mu_;
  std::vector<std::vector<bool>> groups_ ABSL_GUARDED_BY(mu_);
  uint32_t announced_ ABSL_GUARDED_BY(mu_) = 0;
  bool swa_reported_ ABSL_GUARDED_BY(mu_) = false;
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
      MutexLock lock(leases_mu_);
      for (const auto& [id, w] : write_leases_) pending.push_back(id);
    }
    for (LeaseId id : pending) (void)Abort(id);
  }

  // Connects to every node; the namespace comes from the first that answers.
  Status Connect();

  Result<MatchResult> Match(const MatchRequest& req) override;

  Result<MatchResult> MatchKeys(const MatchKeysRequest& req) override;

  FetchFuture Fetch(const FetchRequest& req) override { return FetchFuture::Ready(FetchNow(req)); }

  Result<Reservation> Reserve(const ModelId& model, std::span<const CommitBlock> blocks,
                              Nanos write_lease_ttl) override;

  Result<PublishResult> Publish(LeaseId write_lease, std::span<const uint64_t> checksums) override;

  Result<PublishResult> Commit(const ModelId& model,
                               std::span<const CommitPayload> payloads) override;

  Status RenewLease(LeaseId lease_id, Nanos ttl) override;

  Status Abort(LeaseId lease_id) override;

  // A read lease ends on every node without a round trip (each node client
  // sends it with its next call); anything else is an Abort.
  void Release(LeaseId lease_id) override;

 private:
  std::shared_ptr<const View> Snapshot() const;

  // Rebuilds the view from a node list and the current settings; links to
  // nodes that stay are kept. `heard`: the list comes from a listener call,
  // else from the constructor, whose list loses to any listener call that
  // got in first (it may be older). Serialised; the membership is never
  // asked for its nodes under refresh_mu_ (a membership may call listeners
  // under its own lock).
  void Refresh(const std::vector<NodeInfo>& nodes, bool heard);

  // Unavailable on a read means the node is not serving; on a write it may
  // be a draining node refusing new blocks, which answers all the same.
  static constexpr bool kReads = true;
  static constexpr bool kWrites = false;

  // The node's client, connected on first use; refused while the node is
  // being skipped, except for a probe once the wait is over. `probe` false:
  // only an existing client, whatever the node's state (for work that is
  // queued, not sent).
  Result<std::shared_ptr<NodeClient>> Client(const NodeConn& node, bool probe = true);

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
  static void Heard(const NodeConn& node, bool reads, const Status& st, Nanos started);

  static void Strike(NodeLink& link, const Status& st, Nanos now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(link.mu);

  // Per node of the view: not answering (being skipped, or probed). Such a
  // node takes no new blocks until it answers again. `or_catching_up`: also
  // a node back from an outage for less than its catch-up time, which reads
  // look past as they did while it was down.
  static std::vector<bool> Down(const View& view, bool or_catching_up = false);

  // Probes of the down nodes a write passed over, run alongside it: a
  // client that only writes would otherwise never learn that they answer
  // again (reads ask down nodes, and probe them, on their own). Refused at
  // once unless a node's wait is over.
  void AddProbes(const std::vector<std::shared_ptr<NodeConn>>& displaced,
                 std::vector<std::function<void()>>* tasks);

  // MatchKeys's asks, answers and holders (cluster_match.cc).
  struct KeyMatch;

  // Asks each node, in parallel, for the keys it may hold.
  void AskNodes(KeyMatch& match);

  // Gives the prefix's read lease (some node leases left) its cluster id and
  // keeps it, dropping expired ones when too many are kept.
  void KeepReadLease(std::shared_ptr<ReadLease> lease, MatchResult& out);

  Result<std::string> CallerNamespace() override { return Namespace(); }

  Result<std::string> Namespace();

  // Splits a batch over the write replicas of its blocks. A block keeps its
  // parent only where the parent goes in the same batch to the same node:
  // elsewhere the node may never have seen the parent (it lives on other
  // nodes), and the cluster's prefix is checked across nodes at match time.
  // `displaced`: the down nodes that would have taken some of the blocks.
  void PlanWrites(const View& view, std::span<const CommitBlock> blocks,
                  std::vector<WritePart>* parts, std::vector<std::vector<CommitBlock>>* node_blocks,
                  std::vector<Status>* no_replica,
                  std::vector<std::shared_ptr<NodeConn>>* displaced) const;

  // Reserve's calls: each node's blocks reserved on it, in parallel, with
  // probes of the down nodes passed over; one answer per part.
  std::vector<Result<Reservation>> ReserveOnNodes(
      const ModelId& model, Nanos write_lease_ttl, const std::vector<WritePart>& parts,
      const std::vector<std::vector<CommitBlock>>& node_blocks,
      const std::vector<std::shared_ptr<NodeConn>>& displaced);

  // Gives a reservation that needs the caller's bytes its cluster lease and
  // keeps it, dropping those left alone past their reclaim time.
  void KeepWriteLease(std::shared_ptr<WriteLease> lease, Reservation& out);

  // Adds one node's per-block answer to the tally.
  static void Tally(const std::vector<size_t>& positions, const std::optional<Reservation>& r,
                    const Result<PublishResult>& result, WriteTally* tally);

  void AbortParts(const WriteLease& lease);

  // Ends read leases on their nodes without a round trip: each node
  // client queues the release for its next call or its flusher, so even a
  // node being skipped takes it.
  void ReleaseParts(const std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>>& parts);

  // A node being skipped is not asked: its client queues the lease's end
  // (the node aborts released leases, write leases too) for its next call
  // or its flusher, which no skip holds back. Else the node would keep the
  // space or the pins until the lease expired.
  void AbortParts(const std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>>& parts);

  FetchOutcome FetchNow(const FetchRequest& req);

  // Reads block b from its replicas in turn, all blocks of a round in
  // parallel (one node call per node), until every block arrived, a block
  // ran out of replicas, or the deadline leaves no room for another round.
  void FetchFromReplicas(const FetchRequest& req, const MatchResult& match, const ReadLease& lease,
                         size_t n, bool want_swa, Nanos deadline, FetchOutcome& out);

  // FetchFromReplicas's state across rounds, and one round's call to one
  // node (cluster_fetch.cc).
  struct ReplicaFetch;
  struct SubFetch;

  // Runs a round's sub-fetches in parallel, one node call each. Events of
  // blocks going to `scratch` wait until copied over (TakeOutcomes).
  void RunSubFetches(const FetchRequest& req, std::vector<SubFetch>& subs, FetchEvents& events,
                     std::vector<std::vector<std::byte>>& scratch);

  // Copies from a verified `scratch` payload into `dest` the layer groups of
  // `block` not reported ready yet, and reports them. The header is in place
  // already: a reported group means it was verified there, and it hashes to
  // the same entry checksum as the scratch copy.
  static Status CopyUnreportedGroups(std::span<const std::byte> scratch, std::span<std::byte> dest,
                                     size_t block, FetchEvents& events);

  const std::shared_ptr<Membership> membership_;
  const ClientOptions node_options_;
  const uint32_t replication_option_;
  const Nanos call_timeout_;  // of one node call: a third of the caller's timeout
  TaskPool pool_;
  uint64_t subscription_ = 0;

  Mutex refresh_mu_;
  // A listener call refreshed the view.
  bool heard_ ABSL_GUARDED_BY(refresh_mu_) = false;
  mutable Mutex view_mu_;
  std::shared_ptr<const View> view_ ABSL_GUARDED_BY(view_mu_);

  Mutex ns_mu_;
  // The caller's namespace, as the nodes map the token.
  std::string ns_ ABSL_GUARDED_BY(ns_mu_);

  std::atomic<LeaseId> next_lease_{1};
  Mutex leases_mu_;
  std::unordered_map<LeaseId, std::shared_ptr<ReadLease>> read_leases_ ABSL_GUARDED_BY(leases_mu_);
  std::unordered_map<LeaseId, std::shared_ptr<WriteLease>> write_leases_
      ABSL_GUARDED_BY(leases_mu_);
};

}  // namespace strata
