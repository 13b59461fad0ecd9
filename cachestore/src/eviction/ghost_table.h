// Fingerprints of keys a policy evicted recently, so that it can tell a key
// returning after eviction from a new one (ARC's ghost lists). Each remembers
// a small tag (counted per tag) and a 64-bit value; the oldest is forgotten
// first. Open addressing over one flat array and a FIFO ring: this sits on
// every insert and eviction, so there are no node allocations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace strata {

class GhostTable {
 public:
  static constexpr size_t kTags = 8;
  struct Remembered {
    uint8_t tag = 0;
    uint64_t value = 0;
  };

  // Sized for `expected_live` keys up front: a policy knows its floor, and
  // growing to it rehashes (and faults in) the table eight times over the
  // store's first minutes of traffic.
  explicit GhostTable(size_t expected_live = 0);

  // Removes `fp` if present and returns what it remembered.
  std::optional<Remembered> Take(uint64_t fp);

  // Remembers `fp` (replacing what it held), then forgets the oldest while
  // more than `limit` are live. `tag` < kTags.
  void Add(uint64_t fp, uint8_t tag, uint64_t value, size_t limit);

  size_t count(uint8_t tag) const { return count_[tag]; }
  size_t live() const { return live_; }

 private:
  static constexpr uint64_t kEmpty = 0;
  struct Slot {
    uint64_t fp = kEmpty;
    uint64_t seq = 0;
    uint64_t value = 0;
    uint8_t tag = 0;
  };
  struct Record {
    uint64_t fp = 0;
    uint64_t seq = 0;
  };

  static uint64_t Nonzero(uint64_t fp) { return fp == kEmpty ? 1 : fp; }
  size_t Home(uint64_t fp) const { return (fp * 0x9E3779B97F4A7C15ull) >> shift_; }
  size_t Find(uint64_t fp) const;  // the slot holding fp, or the empty slot where it goes
  void Erase(size_t i);
  void PopOldest();
  void Rehash(size_t size);
  void GrowFifo();

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  unsigned shift_ = 0;
  std::vector<Record> fifo_;
  size_t fifo_head_ = 0;
  size_t fifo_size_ = 0;
  size_t count_[kTags] = {};
  size_t live_ = 0;
  uint64_t seq_ = 0;
};

}  // namespace strata
