// A fixed node list: nothing ever changes, so listeners are never called.
#include <algorithm>
#include <atomic>
#include <utility>

#include "strata/membership.h"

namespace strata {
namespace {

class StaticMembership final : public Membership {
 public:
  StaticMembership(std::vector<NodeInfo> nodes, ClusterSettings settings)
      : nodes_(std::move(nodes)), settings_(settings) {
    std::sort(nodes_.begin(), nodes_.end(),
              [](const NodeInfo& a, const NodeInfo& b) { return a.node_id < b.node_id; });
  }

  std::vector<NodeInfo> Nodes() const override { return nodes_; }
  ClusterSettings Settings() const override { return settings_; }
  uint64_t Subscribe(Listener /*listener*/) override { return ++next_id_; }
  void Unsubscribe(uint64_t /*id*/) override {}

 private:
  std::vector<NodeInfo> nodes_;
  ClusterSettings settings_;
  std::atomic<uint64_t> next_id_{0};
};

}  // namespace

std::unique_ptr<Membership> MakeStaticMembership(std::vector<NodeInfo> nodes,
                                                 ClusterSettings settings) {
  return std::make_unique<StaticMembership>(std::move(nodes), settings);
}

}  // namespace strata
