// SSD write-back: the queue of committed entries, the thread that writes
// them to the SSD tier, and the log that keeps admin scans whole.
#include "store/cache_store_impl.h"
#include "util/mutex.h"

namespace strata {

void CacheStore::Impl::MoveSsdScan(uint64_t from, uint64_t to) {
  if (from != kNoScan) scan_starts.erase(scan_starts.find(from));
  if (to != kNoScan) scan_starts.insert(to);
  const uint64_t keep = scan_starts.empty() ? DemotedEnd() : *scan_starts.begin();
  for (; demoted_base < keep; ++demoted_base) demoted.pop_front();
}

std::string CacheStore::Impl::NamespaceName(uint32_t id) const {
  ReaderLock lock(ns_mu);
  return id < ns_names.size() ? ns_names[id] : std::string();
}

void CacheStore::Impl::EnqueueWriteBack(Entry* e) {
  {
    MutexLock lock(wb_mu);
    if (wb_queue.size() >= opts.ssd_writeback_queue) {
      wb_dropped.fetch_add(1);
      ssd_wb_dropped->Increment();
      return;
    }
    wb_queue.push_back({e, e->generation});
    ssd_wb_pending->Set(static_cast<int64_t>(wb_queue.size() + wb_busy));
  }
  wb_cv.notify_one();
}

void CacheStore::Impl::WriteBackLoop() {
  MutexLock lock(wb_mu);
  while (true) {
    wb_cv.wait(lock.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wb_mu) {
      return wb_stopping || !wb_queue.empty();
    });
    if (wb_queue.empty()) return;  // stopping, and drained
    if (before_write_back) {       // before the batch is taken: a test's gate holds all it queues
      lock.Unlock();
      before_write_back();
      lock.Lock();
    }
    std::vector<EntryRef> batch;
    while (!wb_queue.empty() && batch.size() < opts.ssd_writeback_batch) {
      batch.push_back(wb_queue.front());
      wb_queue.pop_front();
    }
    wb_busy = batch.size();
    lock.Unlock();
    WriteBack(batch);
    lock.Lock();
    wb_busy = 0;
    ssd_wb_pending->Set(static_cast<int64_t>(wb_queue.size()));
    if (wb_queue.empty()) wb_idle_cv.notify_all();
  }
}

void CacheStore::Impl::WriteBack(const std::vector<EntryRef>& batch) {
  std::vector<EntryRef> pinned;
  std::vector<SsdWrite> writes;
  {
    MutexLock lock(structure_mu);  // generations are read under it
    for (const EntryRef& ref : batch) {
      Entry* e = ref.entry;
      Shard& shard = ShardFor(e->key);
      ReaderLock slock(shard.mu);
      if (e->generation != ref.generation || e->state.load() != EntryState::kCommitted) continue;
      e->readers.fetch_add(1);
      pinned.push_back(ref);
    }
  }
  const Nanos to_tier = ssd->Now() - clock->Now();
  // The copy's checksum is taken before the verification: bytes that
  // change after it fail the copy's first read, never pass it.
  std::vector<EntryRef> corrupt;
  std::vector<uint64_t> sums;
  for (size_t i = 0; i < pinned.size();) {
    const Entry* e = pinned[i].entry;
    const std::span<const std::byte> bytes = arena->Bytes(e->extent, e->payload_bytes);
    const uint64_t sum = Checksum64(bytes);
    if (VerifyPayload(*FindLayout(e->layout_id), bytes, e->checksum).ok()) {
      sums.push_back(sum);
      ++i;
      continue;
    }
    corrupt.push_back(pinned[i]);
    pinned.erase(pinned.begin() + static_cast<ptrdiff_t>(i));
  }
  DropCorrupt(corrupt);
  for (const EntryRef& ref : corrupt) Unpin(ref, /*lease=*/false);
  for (size_t i = 0; i < pinned.size(); ++i) {
    const Entry* e = pinned[i].entry;
    SsdWrite w;
    w.key = {NamespaceName(e->key.ns), e->model_id, e->key.chain, e->key.kind};
    w.payload = arena->Bytes(e->extent, e->payload_bytes);
    w.readable_bytes = e->extent.length;  // 4 KiB granules: written in place
    w.entry_checksum = e->checksum;
    w.layout_id = e->layout_id;
    w.commit_time = e->commit_time + to_tier;  // a copy, not a new entry
    w.data_checksum = sums[i];
    writes.push_back(std::move(w));
  }
  if (!writes.empty()) (void)ssd->WriteBatch(writes);  // failures are counted by the tier
  if (after_write_back_write) after_write_back_write();
  // Our reader pin kept capacity eviction away, so an entry deleted while
  // it was written went on purpose (Delete, Evict, TTL, checksum). Its
  // SSD copy goes too: the delete's own SSD erase may have run before the
  // copy existed. A delete after this check finds the copy and erases it.
  for (size_t i = 0; i < pinned.size(); ++i) {
    if (pinned[i].entry->state.load() == EntryState::kDeleting) (void)ssd->Erase(writes[i].key);
  }
  for (const EntryRef& ref : pinned) Unpin(ref, /*lease=*/false);
}

void CacheStore::Impl::DropCorrupt(const std::vector<EntryRef>& corrupt) {
  if (corrupt.empty()) return;
  m.checksum_failures->Increment(corrupt.size());
  MutexLock lock(structure_mu);
  for (const EntryRef& ref : corrupt) {
    Entry* e = ref.entry;
    if (e->generation == ref.generation && e->state.load() == EntryState::kCommitted) {
      DeleteSubtree(e, EvictReason::kChecksum);
    }
  }
}

}  // namespace strata
