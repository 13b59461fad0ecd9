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
      const size_t rank =
          static_cast<size_t>(std::find(ranked[b].begin(), ranked[b].end(), i) - ranked[b].begin());
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
    MutexLock lock(leases_mu_);
    if (read_leases_.size() >= kMaxTrackedLeases) {
      // Never released: the nodes end them by themselves.
      const Nanos now = SteadyClock().Now();
      std::erase_if(read_leases_, [&](const auto& kv) { return kv.second->expiry <= now; });
    }
    read_leases_.emplace(out.lease, std::move(lease));
  }
  return out;
}

}  // namespace strata
