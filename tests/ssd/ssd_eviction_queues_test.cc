// EvictionQueues (the SSD tier's eviction order) against the plain
// reference it replaces: sort every entry by (time + its queue's offset,
// order, key).
#include "ssd/eviction_queues.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace strata {
namespace {

struct Item {
  size_t queue = 0;
  EvictionQueues<Item>::Position pos;
  bool queued = false;
};

std::vector<const Item*> ReferenceOrder(const std::list<Item>& items,
                                        const std::vector<uint64_t>& offsets) {
  std::vector<const Item*> out;
  for (const Item& it : items) {
    if (it.queued) out.push_back(&it);
  }
  auto rank = [&](const Item* i) {
    return std::make_tuple(i->pos.time + offsets[i->queue], i->pos.order, std::cref(*i->pos.key));
  };
  std::sort(out.begin(), out.end(),
            [&](const Item* a, const Item* b) { return rank(a) < rank(b); });
  return out;
}

std::vector<const Item*> QueuesOrder(const EvictionQueues<Item>& q,
                                     const std::vector<uint64_t>& offsets, size_t limit) {
  std::vector<const Item*> out;
  q.ForEachInRankOrder(offsets, [&](size_t queue, const EvictionQueues<Item>::Position& p) {
    if (out.size() == limit) return false;
    EXPECT_EQ(p.item->queue, queue);
    out.push_back(p.item);
    return true;
  });
  return out;
}

TEST(EvictionQueuesTest, RanksLikeASortOfEveryEntryThroughInsertsAndErases) {
  constexpr size_t kQueues = 6;
  std::mt19937_64 rng(7);
  std::list<std::string> keys;  // stable addresses, as the tier's map gives
  std::list<Item> items;
  EvictionQueues<Item> queues(kQueues);
  for (int round = 0; round < 200; ++round) {
    // Small ranges, so times, orders and time + offset sums tie often.
    for (int n = 0; n < 20; ++n) {
      // Unique keys (the tier's are), in an order unrelated to insertion.
      keys.push_back(std::to_string(rng() % 1000) + "/" + std::to_string(keys.size()));
      Item& it = items.emplace_back();
      it.queue = rng() % kQueues;
      it.pos = {rng() % 50, rng() % 4, &keys.back(), &it};
      it.queued = true;
      queues.Insert(it.queue, it.pos);
    }
    for (Item& it : items) {
      if (it.queued && rng() % 4 == 0) {
        queues.Erase(it.queue, it.pos);
        it.queued = false;
      }
    }
    std::vector<uint64_t> offsets(kQueues);
    for (uint64_t& o : offsets) o = rng() % 60;
    const std::vector<const Item*> want = ReferenceOrder(items, offsets);
    ASSERT_EQ(queues.size(), want.size());
    EXPECT_EQ(QueuesOrder(queues, offsets, want.size()), want);
    // Stopping early visits a prefix of the same order.
    const size_t limit = want.size() / 3;
    EXPECT_EQ(QueuesOrder(queues, offsets, limit),
              std::vector<const Item*>(want.begin(), want.begin() + static_cast<long>(limit)));
  }
}

}  // namespace
}  // namespace strata
