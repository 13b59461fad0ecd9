#include "cluster/placement.h"

#include <xxhash.h>

#include <algorithm>
#include <numeric>
#include <utility>

namespace strata {
namespace {

uint64_t IdSeed(std::string_view node_id) { return XXH3_64bits(node_id.data(), node_id.size()); }

uint64_t Score(const ChainKey& key, uint64_t id_seed) {
  // Seeding with the node's id hash gives every node an independent hash of
  // the key: the score order of the nodes is a uniform random permutation.
  return XXH3_64bits_withSeed(key.bytes.data(), key.bytes.size(), id_seed);
}

}  // namespace

uint64_t PlacementScore(const ChainKey& key, std::string_view node_id) {
  return Score(key, IdSeed(node_id));
}

Placement::Placement(std::vector<NodeInfo> nodes) : nodes_(std::move(nodes)) {
  // Sorted by id so ties (equal scores) break the same way in every client.
  std::sort(nodes_.begin(), nodes_.end(),
            [](const NodeInfo& a, const NodeInfo& b) { return a.node_id < b.node_id; });
  id_seeds_.reserve(nodes_.size());
  for (const NodeInfo& n : nodes_) id_seeds_.push_back(IdSeed(n.node_id));
}

std::vector<size_t> Placement::Ranking(const ChainKey& key) const {
  std::vector<std::pair<uint64_t, size_t>> scored;
  scored.reserve(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) scored.emplace_back(Score(key, id_seeds_[i]), i);
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<size_t> order;
  order.reserve(scored.size());
  for (const auto& [score, index] : scored) order.push_back(index);
  return order;
}

std::vector<size_t> Placement::WriteReplicas(const ChainKey& key, uint32_t replicas,
                                             const std::vector<bool>& down) const {
  std::vector<size_t> out;
  for (size_t i : Ranking(key)) {
    if (out.size() >= replicas) break;
    if (Writable(i, down)) out.push_back(i);
  }
  return out;
}

std::vector<size_t> Placement::ReadReplicas(const ChainKey& key, uint32_t replicas,
                                            const std::vector<bool>& down) const {
  std::vector<size_t> out;
  size_t writable = 0;
  for (size_t i : Ranking(key)) {
    if (writable >= replicas && out.size() >= replicas) break;
    out.push_back(i);
    if (Writable(i, down)) ++writable;
  }
  return out;
}

}  // namespace strata
