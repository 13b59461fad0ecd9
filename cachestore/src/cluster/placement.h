// Where a block lives in a cluster (DESIGN §6): rendezvous (HRW) hashing of
// its chain key over the live nodes. Every client that sees the same node
// list places a key on the same nodes, without coordination; a node joining
// or leaving moves only the keys whose top R it enters or leaves.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "strata/chain_key.h"
#include "strata/membership.h"

namespace strata {

// The rendezvous score of `key` on the node with this id; the R highest
// scores hold the key.
uint64_t PlacementScore(const ChainKey& key, std::string_view node_id);

class Placement {
 public:
  explicit Placement(std::vector<NodeInfo> nodes);

  const std::vector<NodeInfo>& nodes() const { return nodes_; }

  // The nodes a new block is written to: the `replicas` best-scoring nodes
  // that are neither draining nor down (fewer when fewer are). Indices into
  // nodes(); `down[i]` marks node i as not answering (missing: answering).
  std::vector<size_t> WriteReplicas(const ChainKey& key, uint32_t replicas,
                                    const std::vector<bool>& down = {}) const;

  // The nodes that may hold the block, best first: the write replicas, plus
  // the draining and down nodes that ranked above them (they took the
  // block's writes before they started draining or stopped answering; a
  // draining node serves reads until it leaves, a down one once it is back).
  // A caller may mark down a node that answers, to ask the nodes that took
  // its writes while it did not.
  std::vector<size_t> ReadReplicas(const ChainKey& key, uint32_t replicas,
                                   const std::vector<bool>& down = {}) const;

 private:
  // Every node, best score first.
  std::vector<size_t> Ranking(const ChainKey& key) const;
  bool Writable(size_t node, const std::vector<bool>& down) const {
    return !nodes_[node].draining && (node >= down.size() || !down[node]);
  }

  std::vector<NodeInfo> nodes_;
  std::vector<uint64_t> id_seeds_;  // per node: hash of its id
};

}  // namespace strata
