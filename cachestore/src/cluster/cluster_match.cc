// Match across the cluster: each node asked for the keys it may hold, the
// usable prefix combined from the replicas' answers under one cluster lease.
#include "cluster/cluster_store_impl.h"
#include "util/mutex.h"

namespace strata {

Result<MatchResult> ClusterStore::Match(const MatchRequest& req) {
  Result<std::string> ns = Namespace();
  if (!ns.ok()) return ns.status();
  std::vector<ChainKey> keys;
  Result<MatchKeysRequest> by_keys = DeriveMatchKeys(*ns, req, &keys);
  if (!by_keys.ok()) return by_keys.status();
  return MatchKeys(*by_keys);
}

// One MatchKeys: what each node is asked and answers, and who holds what.
struct ClusterStore::KeyMatch {
  struct NodeAnswer {
    std::vector<ChainKey> keys;
    Result<MatchResult> result = Unavailable("not asked");
  };
  using Parts = std::vector<std::pair<std::shared_ptr<NodeConn>, LeaseId>>;

  KeyMatch(const MatchKeysRequest& request, const View& snapshot);
  KeyMatch(const KeyMatch&) = delete;
  KeyMatch& operator=(const KeyMatch&) = delete;

  // Who holds what; returns how many nodes answered.
  size_t TakeAnswers();
  void AddHolders(size_t i, const MatchResult& r);
  // Orders each block's replicas and returns the usable prefix.
  size_t OrderReplicas(MatchResult& out);
  void PickSwa(size_t usable, MatchResult& out);
  // Keeps the node leases that serve the prefix; returns the others.
  Parts DropUnusedParts();

  const MatchKeysRequest& req;
  const View& view;
  const size_t n;
  std::vector<std::vector<size_t>> asked;   // per node: blocks, in prompt order
  std::vector<std::vector<size_t>> ranked;  // per block: replicas, best first
  std::vector<NodeAnswer> answers;
  std::shared_ptr<ReadLease> lease = std::make_shared<ReadLease>();
  std::vector<Nanos> part_expiry;  // beside lease->parts
  std::vector<std::vector<Holder>> holders;
  std::vector<std::pair<size_t, Holder>> swa_seen;  // (boundary, holder), per node
  Status first_error;
};

Result<MatchResult> ClusterStore::MatchKeys(const MatchKeysRequest& req) {
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

  KeyMatch match(req, *view);
  AskNodes(match);
  if (match.TakeAnswers() == 0) return match.first_error;
  const size_t usable = match.OrderReplicas(out);
  match.PickSwa(usable, out);
  match.holders.resize(usable);
  ReleaseParts(match.DropUnusedParts());
  match.lease->holders = std::move(match.holders);
  if (!match.lease->parts.empty()) KeepReadLease(std::move(match.lease), out);
  return out;
}

// The keys each node may hold, in prompt order.
ClusterStore::KeyMatch::KeyMatch(const MatchKeysRequest& request, const View& snapshot)
    : req(request),
      view(snapshot),
      n(req.keys.size()),
      asked(view.conns.size()),
      ranked(n),
      answers(view.conns.size()),
      holders(n) {
  const std::vector<bool> read_past = Down(view, /*or_catching_up=*/true);
  for (size_t b = 0; b < n; ++b) {
    ranked[b] = view.placement.ReadReplicas(req.keys[b], view.replication, read_past);
    for (size_t node : ranked[b]) asked[node].push_back(b);
  }
}

void ClusterStore::AskNodes(KeyMatch& match) {
  std::vector<std::function<void()>> tasks;
  for (size_t i = 0; i < match.view.conns.size(); ++i) {
    if (match.asked[i].empty()) continue;
    tasks.emplace_back([&, i] {
      KeyMatch::NodeAnswer& a = match.answers[i];
      for (size_t b : match.asked[i]) a.keys.push_back(match.req.keys[b]);
      MatchKeysRequest sub = match.req;
      sub.keys = a.keys;
      sub.independent_keys = true;
      a.result = OnNode(*match.view.conns[i], kReads,
                        [&](NodeClient& client) { return client.MatchKeys(sub); });
    });
  }
  pool_.RunAll(std::move(tasks));
}

// A node that failed holds nothing.
size_t ClusterStore::KeyMatch::TakeAnswers() {
  size_t answered = 0;
  for (size_t i = 0; i < view.conns.size(); ++i) {
    if (asked[i].empty()) continue;
    Result<MatchResult>& r = answers[i].result;
    if (!r.ok()) {
      if (first_error.ok()) first_error = r.status();
      continue;
    }
    ++answered;
    AddHolders(i, *r);
  }
  return answered;
}

// Node i's hits, and its SWA state if it lies on one of them.
void ClusterStore::KeyMatch::AddHolders(size_t i, const MatchResult& r) {
  const std::shared_ptr<NodeConn>& node = view.conns[i];
  if (r.lease != 0) {
    lease->parts.emplace_back(node, r.lease);
    part_expiry.push_back(r.lease_expiry);
  }
  // Hits come back in request order: walk the asked positions along.
  std::unordered_map<ChainKey, size_t> position;
  size_t at = 0;
  for (const BlockMatch& bm : r.blocks) {
    while (at < asked[i].size() && req.keys[asked[i][at]] != bm.key) ++at;
    if (at == asked[i].size()) break;  // not a key we asked for: ignore the rest
    const size_t b = asked[i][at];
    const size_t rank =
        static_cast<size_t>(std::find(ranked[b].begin(), ranked[b].end(), i) - ranked[b].begin());
    holders[b].push_back({node, r.lease, bm, rank});
    position[bm.key] = asked[i][at];
    ++at;
  }
  if (r.swa.has_value()) {
    auto it = position.find(r.swa->entry.key);
    if (it != position.end()) {
      const size_t boundary = it->second + 1;
      const std::vector<size_t>& order = ranked[boundary - 1];
      const auto rank =
          static_cast<size_t>(std::find(order.begin(), order.end(), i) - order.begin());
      swa_seen.emplace_back(boundary, Holder{node, r.lease, r.swa->entry, rank});
    }
  }
}

// Replicas in placement order (every client reads a block from the same
// node, so one copy stays hot), one in DRAM first.
size_t ClusterStore::KeyMatch::OrderReplicas(MatchResult& out) {
  size_t usable = 0;
  while (usable < n && !holders[usable].empty()) ++usable;
  for (size_t b = 0; b < usable; ++b) {
    std::sort(holders[b].begin(), holders[b].end(),
              [](const Holder& x, const Holder& y) { return x.rank < y.rank; });
    std::stable_partition(holders[b].begin(), holders[b].end(),
                          [](const Holder& h) { return h.block.tier == Tier::kDram; });
    out.blocks.push_back(holders[b].front().block);
  }
  if (usable > 0) out.prefix_key = req.keys[usable - 1];
  return usable;
}

// The deepest SWA state a node saw within the prefix (a node that saw a
// deeper one, beyond the prefix, is not asked again), and its replicas.
void ClusterStore::KeyMatch::PickSwa(size_t usable, MatchResult& out) {
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
}

// A node whose hits all lie past the prefix serves none of it: its lease
// ends now instead of pinning those entries until it expires. The lease
// lasts as long as the node leases it keeps.
ClusterStore::KeyMatch::Parts ClusterStore::KeyMatch::DropUnusedParts() {
  Parts kept;
  Parts unused;
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
  return unused;
}

void ClusterStore::KeepReadLease(std::shared_ptr<ReadLease> lease, MatchResult& out) {
  out.lease = next_lease_.fetch_add(1);
  out.lease_expiry = lease->expiry;
  MutexLock lock(leases_mu_);
  if (read_leases_.size() >= kMaxTrackedLeases) {
    // Never released: the nodes end them by themselves.
    const Nanos now = SteadyClock().Now();
    std::erase_if(read_leases_, [&](const auto& kv) { return kv.second->expiry <= now; });
  }
  read_leases_.emplace(out.lease, std::move(lease));
}

}  // namespace strata
