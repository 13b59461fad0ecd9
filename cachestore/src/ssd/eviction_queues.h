// The SSD tier's eviction order, kept as entries change instead of sorted
// at every eviction: a few queues, each ordered by (time, order, key), and
// an offset per queue added to its times. Ranked together, the entries go
// by (time + offset of their queue, order, key). Under LRU there is one
// queue (time: the last access); under the deadline policy one per class
// of earlier uses plus one for shadows of DRAM entries (time: the model
// tick; offset: the class's holding time, which moves every entry of the
// class at once and is why a queue per class is enough).
//
// Finding victims is then O(victims x queues) (plus entries being read,
// which are stepped over) instead of a sort of the whole tier under its
// lock. Not thread-safe: SsdTier guards it.
#pragma once

#include <absl/container/btree_set.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace strata {

template <typename Item>
class EvictionQueues {
 public:
  // Where an entry ranks. `key` points at the key the tier owns (stable for
  // as long as the entry is queued); it breaks ties, so a run is repeatable.
  struct Position {
    uint64_t time = 0;
    uint64_t order = 0;
    const std::string* key = nullptr;
    Item* item = nullptr;
  };

  explicit EvictionQueues(size_t queues) : queues_(queues) {}

  void Insert(size_t queue, const Position& p) { queues_[queue].insert(p); }
  void Erase(size_t queue, const Position& p) { queues_[queue].erase(p); }
  bool Contains(size_t queue, const Position& p) const {
    auto it = queues_[queue].find(p);
    return it != queues_[queue].end() && it->item == p.item;
  }
  size_t size() const {
    size_t n = 0;
    for (const Queue& q : queues_) n += q.size();
    return n;
  }

  // Calls visit(queue, position) in rank order, `offsets[q]` added to queue
  // q's times, while it returns true. The queues must not change meanwhile:
  // collect, then erase.
  template <typename Visit>
  void ForEachInRankOrder(std::span<const uint64_t> offsets, Visit visit) const {
    std::vector<QueueIterator> heads;
    heads.reserve(queues_.size());
    for (const Queue& q : queues_) heads.push_back(q.begin());
    auto rank = [&](size_t q) {
      const Position& p = *heads[q];
      return std::make_tuple(p.time + offsets[q], p.order, std::cref(*p.key));
    };
    for (;;) {
      size_t best = queues_.size();
      for (size_t q = 0; q < queues_.size(); ++q) {
        if (heads[q] == queues_[q].end()) continue;
        if (best == queues_.size() || rank(q) < rank(best)) best = q;
      }
      if (best == queues_.size() || !visit(best, *heads[best])) return;
      ++heads[best];
    }
  }

 private:
  struct Less {
    bool operator()(const Position& a, const Position& b) const {
      return std::tie(a.time, a.order, *a.key) < std::tie(b.time, b.order, *b.key);
    }
  };
  using Queue = absl::btree_set<Position, Less>;
  using QueueIterator = typename Queue::const_iterator;
  std::vector<Queue> queues_;
};

}  // namespace strata
