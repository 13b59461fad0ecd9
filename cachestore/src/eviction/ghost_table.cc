#include "eviction/ghost_table.h"

#include <algorithm>
#include <bit>

namespace strata {

GhostTable::GhostTable(size_t expected_live) {
  // Add keeps the load at most a half; the FIFO ring holds up to 2x live.
  Rehash(std::bit_ceil(std::max<size_t>(1024, 2 * (expected_live + 1))));
  fifo_.resize(std::bit_ceil(std::max<size_t>(1024, 2 * expected_live + 64)));
}

std::optional<GhostTable::Remembered> GhostTable::Take(uint64_t fp) {
  const size_t i = Find(Nonzero(fp));
  if (slots_[i].fp == kEmpty) return std::nullopt;
  const Remembered r{slots_[i].tag, slots_[i].value};
  --count_[r.tag];
  --live_;
  Erase(i);
  return r;
}

void GhostTable::Add(uint64_t fp, uint8_t tag, uint64_t value, size_t limit) {
  fp = Nonzero(fp);  // 0 marks an empty slot
  (void)Take(fp);
  if (2 * (live_ + 1) > slots_.size()) Rehash(slots_.size() * 2);
  slots_[Find(fp)] = {fp, ++seq_, value, tag};
  ++count_[tag];
  ++live_;
  if (fifo_size_ == fifo_.size()) GrowFifo();
  fifo_[(fifo_head_ + fifo_size_++) & (fifo_.size() - 1)] = {fp, seq_};
  // The ring also holds records of keys taken since: bound it too.
  while (live_ > limit || fifo_size_ > 2 * limit + 64) PopOldest();
}

size_t GhostTable::Find(uint64_t fp) const {
  size_t i = Home(fp);
  while (slots_[i].fp != kEmpty && slots_[i].fp != fp) i = (i + 1) & mask_;
  return i;
}

void GhostTable::Erase(size_t i) {  // backward-shift deletion keeps probe chains intact
  size_t j = i;
  while (true) {
    j = (j + 1) & mask_;
    if (slots_[j].fp == kEmpty) break;
    if (((j - Home(slots_[j].fp)) & mask_) >= ((j - i) & mask_)) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i] = Slot{};
}

void GhostTable::PopOldest() {
  const Record r = fifo_[fifo_head_];
  fifo_head_ = (fifo_head_ + 1) & (fifo_.size() - 1);
  --fifo_size_;
  const size_t i = Find(r.fp);
  if (slots_[i].fp != kEmpty && slots_[i].seq == r.seq) {
    --count_[slots_[i].tag];
    --live_;
    Erase(i);
  }
}

void GhostTable::Rehash(size_t size) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(size, Slot{});
  mask_ = size - 1;
  shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(size));
  for (const Slot& s : old) {
    if (s.fp != kEmpty) slots_[Find(s.fp)] = s;
  }
}

void GhostTable::GrowFifo() {
  std::vector<Record> bigger(std::max<size_t>(1024, fifo_.size() * 2));
  for (size_t k = 0; k < fifo_size_; ++k) bigger[k] = fifo_[(fifo_head_ + k) & (fifo_.size() - 1)];
  fifo_ = std::move(bigger);
  fifo_head_ = 0;
}

}  // namespace strata
