// Adaptive segmented LRU ("aslru").
//
// A KV-cache block is worth keeping if its prefix comes back, and in real
// traffic most blocks never do: the first turn of a conversation that never
// continues, the partial tail of every prompt. Plain LRU lets each of them
// push out a block that has already proven it is reused. So:
//  - New entries enter a probation LRU; a hit promotes them to a protected
//    LRU. Eviction takes from probation while it is above its target size.
//  - Evicted keys are remembered (64-bit fingerprints, no bytes) in a ghost
//    list per segment. A key that returns from the probation ghost says
//    probation was too small to keep it until its reuse: grow the target.
//    One returning from the protected ghost says the opposite. (ARC's
//    adaptation, Megiddo and Modha, FAST '03, plus a windowed multiplicative
//    correction, below.) Either way the returning entry has proven reuse
//    and goes straight to protected.
// The target adapts to the capacity and the traffic: small when reuse
// distances exceed what probation could hold anyway, large when most
// first reuses fit. Measurements: docs/eviction-policy.md.
//
// Within each segment the store's root-last touches keep ancestors younger
// than descendants; across segments that order can break, and the store's
// rule that only leaves are evicted keeps eviction prefix-safe regardless.
#include <algorithm>
#include <vector>

#include "eviction_policy.h"

namespace strata {
namespace {

// Fingerprints of recently evicted keys and the segment each left from,
// oldest forgotten first. Open addressing over one flat array and a FIFO
// ring: this sits on every insert and eviction, so no node allocations.
class GhostTable {
 public:
  GhostTable() { Rehash(1024); }

  // Removes `fp` if present; returns the segment it left from, or -1.
  int Take(uint64_t fp) {
    fp = Nonzero(fp);
    size_t i = Find(fp);
    if (slots_[i].fp == kEmpty) return -1;
    const int segment = slots_[i].segment;
    Erase(i);
    --count_[segment];
    return segment;
  }

  // Remembers `fp`, then forgets the oldest while more than `limit` live.
  void Add(uint64_t fp, int segment, size_t limit) {
    fp = Nonzero(fp);  // 0 marks an empty slot
    (void)Take(fp);
    if (2 * (live() + 1) > slots_.size()) Rehash(slots_.size() * 2);
    const size_t i = Find(fp);
    slots_[i] = {fp, ++seq_, static_cast<uint8_t>(segment)};
    ++count_[segment];
    if (fifo_size_ == fifo_.size()) GrowFifo();
    fifo_[(fifo_head_ + fifo_size_++) & (fifo_.size() - 1)] = {fp, seq_};
    while (live() > limit || fifo_size_ > 2 * limit + 64) PopOldest();
  }

  size_t count(int segment) const { return count_[segment]; }

 private:
  static constexpr uint64_t kEmpty = 0;
  struct Slot {
    uint64_t fp = kEmpty;
    uint64_t seq = 0;
    uint8_t segment = 0;
  };
  struct Record {
    uint64_t fp = 0;
    uint64_t seq = 0;
  };

  size_t live() const { return count_[0] + count_[1]; }
  static uint64_t Nonzero(uint64_t fp) { return fp == kEmpty ? 1 : fp; }
  size_t Find(uint64_t fp) const {  // the slot holding fp, or the empty slot where it goes
    fp = Nonzero(fp);
    size_t i = (fp * 0x9E3779B97F4A7C15ull) >> shift_;
    while (slots_[i].fp != kEmpty && slots_[i].fp != fp) i = (i + 1) & mask_;
    return i;
  }
  void Erase(size_t i) {  // backward-shift deletion keeps probe chains intact
    size_t j = i;
    while (true) {
      j = (j + 1) & mask_;
      if (slots_[j].fp == kEmpty) break;
      const size_t home = (slots_[j].fp * 0x9E3779B97F4A7C15ull) >> shift_;
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
  }
  void PopOldest() {
    const Record r = fifo_[fifo_head_];
    fifo_head_ = (fifo_head_ + 1) & (fifo_.size() - 1);
    --fifo_size_;
    const size_t i = Find(r.fp);
    if (slots_[i].fp != kEmpty && slots_[i].seq == r.seq) {
      --count_[slots_[i].segment];
      Erase(i);
    }
  }
  void Rehash(size_t size) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(size, Slot{});
    mask_ = size - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(size));
    for (const Slot& s : old) {
      if (s.fp != kEmpty) slots_[Find(s.fp)] = s;
    }
  }
  void GrowFifo() {
    std::vector<Record> bigger(std::max<size_t>(1024, fifo_.size() * 2));
    for (size_t k = 0; k < fifo_size_; ++k)
      bigger[k] = fifo_[(fifo_head_ + k) & (fifo_.size() - 1)];
    fifo_ = std::move(bigger);
    fifo_head_ = 0;
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  unsigned shift_ = 0;
  std::vector<Record> fifo_;
  size_t fifo_head_ = 0;
  size_t fifo_size_ = 0;
  size_t count_[2] = {0, 0};
  uint64_t seq_ = 0;
};

class AdaptiveSlruPolicy final : public EvictionPolicy {
 public:
  explicit AdaptiveSlruPolicy(uint64_t capacity_bytes)
      : capacity_(static_cast<double>(capacity_bytes)), target_(kInitialTarget * capacity_) {}

  std::string_view name() const override { return "aslru"; }

  void OnInsert(Entry* e) override {
    e->in_policy = true;
    const uint64_t fp = EntryKeyHash{}(e->key);
    const double size = static_cast<double>(e->extent.length);
    const int ghost = ghosts_.Take(fp);
    if (ghost == kProbation) {
      target_ += kStep * size * Ratio(ghosts_.count(kProtected), ghosts_.count(kProbation));
      ++window_hits_[kProbation];
      Place(e, kProtected);
    } else if (ghost == kProtected) {
      target_ -= kStep * size * Ratio(ghosts_.count(kProbation), ghosts_.count(kProtected));
      ++window_hits_[kProtected];
      Place(e, kProtected);
    } else {
      Place(e, kProbation);
    }
    // ARC's per-hit steps are a fraction of an entry: far too slow to move
    // the target across orders of magnitude within a trace. So also, every
    // kWindow insertions, scale it towards the segment whose ghosts were hit
    // more often.
    if (++window_inserts_ >= kWindow) {
      if (window_hits_[kProbation] > window_hits_[kProtected]) target_ *= kWindowFactor;
      if (window_hits_[kProbation] < window_hits_[kProtected]) target_ /= kWindowFactor;
      window_inserts_ = 0;
      window_hits_[kProbation] = window_hits_[kProtected] = 0;
    }
    target_ = std::clamp(target_, kMinTarget * capacity_, kMaxTarget * capacity_);
  }

  void OnAccess(Entry* e) override {
    if (!e->in_policy) return;
    List(e).Unlink(e);
    Place(e, kProtected);
  }

  void OnErase(Entry* e) override {
    if (!e->in_policy) return;
    const bool was_probation = e->policy_aux == static_cast<uint64_t>(kProbation);
    List(e).Unlink(e);
    e->in_policy = false;
    // Both segments' ghosts share one table: kGhostFactor keys per
    // resident entry for each.
    const size_t limit = static_cast<size_t>(
        2 * kGhostFactor * static_cast<double>(probation_.count + protected_.count + 1));
    ghosts_.Add(EntryKeyHash{}(e->key), was_probation ? kProbation : kProtected, limit);
  }

  Entry* PickVictim(const std::function<bool(const Entry&)>& evictable, size_t max_scan,
                    uint64_t incoming_bytes) override {
    // New entries land in probation: count them, or room for them would
    // always be taken from protected while probation sits at its target.
    const bool probation_first =
        static_cast<double>(probation_.bytes + incoming_bytes) > target_ || protected_.count == 0;
    EntryList& first = probation_first ? probation_ : protected_;
    EntryList& second = probation_first ? protected_ : probation_;
    if (Entry* v = first.FindFromTail(evictable, max_scan, /*descend=*/true)) return v;
    return second.FindFromTail(evictable, max_scan, /*descend=*/true);
  }

 private:
  enum : int { kProbation = 0, kProtected = 1 };
  // Tuned on the Mooncake conversation trace at 1M, 3M and 10M tokens; see
  // docs/eviction-policy.md for the sweep.
  static constexpr double kStep = 0.5;        // target change per ghost hit, in entry sizes
  static constexpr double kGhostFactor = 8;   // ghost keys per resident entry, per segment
  static constexpr double kMinTarget = 0.01;  // of capacity
  static constexpr double kMaxTarget = 0.9;
  static constexpr double kInitialTarget = 0.05;
  static constexpr size_t kWindow = 2048;  // insertions per windowed adjustment
  static constexpr double kWindowFactor = 1.15;

  static double Ratio(size_t other, size_t self) {
    return std::max(1.0,
                    static_cast<double>(other) / static_cast<double>(std::max<size_t>(1, self)));
  }
  EntryList& List(const Entry* e) {
    return e->policy_aux == static_cast<uint64_t>(kProbation) ? probation_ : protected_;
  }
  void Place(Entry* e, int segment) {
    e->policy_aux = static_cast<uint64_t>(segment);
    (segment == kProbation ? probation_ : protected_).PushFront(e);
  }

  EntryList probation_;
  EntryList protected_;
  GhostTable ghosts_;
  size_t window_inserts_ = 0;
  size_t window_hits_[2] = {0, 0};
  const double capacity_;  // of the tier, bytes
  double target_;          // probation's target size, bytes
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeAdaptiveSlruPolicy(uint64_t capacity_bytes) {
  return std::make_unique<AdaptiveSlruPolicy>(capacity_bytes);
}

}  // namespace strata
