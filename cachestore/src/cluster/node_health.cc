// Node health: the membership view, one client per node, skipping a node
// that stops answering and probing it back.
#include "cluster/cluster_store_impl.h"
#include "util/mutex.h"

namespace strata {

Status ClusterStore::Connect() {
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

std::shared_ptr<const View> ClusterStore::Snapshot() const {
  MutexLock lock(view_mu_);
  return view_;
}

void ClusterStore::Refresh(const std::vector<NodeInfo>& nodes, bool heard) {
  MutexLock refresh(refresh_mu_);
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
  MutexLock lock(view_mu_);
  view_ = std::move(view);
}

Result<std::shared_ptr<NodeClient>> ClusterStore::Client(const NodeConn& node, bool probe) {
  NodeLink& link = *node.link;
  MutexLock lock(link.mu);
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
  lock.Unlock();  // connecting may take a call deadline
  ClientOptions options = node_options_;
  options.timeout = call_timeout_;
  Result<std::unique_ptr<NodeClient>> client = ConnectNode(node.info.address, options);
  Status refused;
  if (client.ok()) {
    MutexLock ns_lock(ns_mu_);
    if (ns_.empty()) ns_ = (*client)->caller_namespace();
    if (ns_ != (*client)->caller_namespace()) {
      refused = Internal(who() + " maps this token to another namespace than its peers");
    }
  } else {
    refused = Status(client.status().code(), who() + ": " + client.status().message());
  }
  lock.Lock();
  link.connecting = false;
  if (!refused.ok()) {
    Strike(link, refused, SteadyClock().Now());
    return refused;
  }
  link.client = std::move(client).value();
  return link.client;
}

void ClusterStore::Heard(const NodeConn& node, bool reads, const Status& st, Nanos started) {
  const bool silent = st.code() == StatusCode::kDeadlineExceeded ||
                      (reads && st.code() == StatusCode::kUnavailable);
  if (!silent && st.code() == StatusCode::kUnavailable) return;
  NodeLink& link = *node.link;
  MutexLock lock(link.mu);
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
  Strike(link, Status(st.code(), "not answering (" + st.message() + ")"), now);
}

void ClusterStore::Strike(NodeLink& link, const Status& st, Nanos now) {
  if (link.skip_for == 0) link.down_since = now;
  link.skip_for = link.skip_for == 0 ? kFirstSkip : std::min(2 * link.skip_for, kMaxSkip);
  link.skip_until = now + link.skip_for;
  link.struck_at = now;
  link.last_error = st;
}

std::vector<bool> ClusterStore::Down(const View& view, bool or_catching_up) {
  const Nanos now = SteadyClock().Now();
  std::vector<bool> down(view.conns.size(), false);
  for (size_t i = 0; i < view.conns.size(); ++i) {
    NodeLink& link = *view.conns[i]->link;
    MutexLock lock(link.mu);
    down[i] = link.skip_for > 0 || (or_catching_up && now < link.catch_up_until);
  }
  return down;
}

void ClusterStore::AddProbes(const std::vector<std::shared_ptr<NodeConn>>& displaced,
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

Result<std::string> ClusterStore::Namespace() {
  {
    MutexLock lock(ns_mu_);
    if (!ns_.empty()) return ns_;
  }
  STRATA_RETURN_IF_ERROR(Connect());
  MutexLock lock(ns_mu_);
  return ns_;
}

}  // namespace strata
