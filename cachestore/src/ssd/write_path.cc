// The write path: data first (and synced), then the index entries.
#include "ssd/ssd_tier_impl.h"
#include "util/mutex.h"

namespace strata {

std::vector<Status> SsdTier::WriteBatch(std::span<const SsdWrite> writes) {
  Impl& s = *impl_;
  Impl::WriteRun w(writes);
  w.now = s.clock->Now();
  const bool index_ok = s.RecoverIndex();
  const uint64_t incoming = s.AdmitWrites(w, index_ok);
  if (incoming == 0) return std::move(w.out);
  s.MakeRoom(incoming, /*ttl=*/false);
  // Place every entry, then write them all in one pass over a ring.
  s.PlaceWrites(w);
  Impl::Reservation reservation(s);
  if (!s.ReserveWriteRoom(w, reservation)) return std::move(w.out);
  s.ChecksumWrites(w);
  if (s.opts.before_data_write_hook) s.opts.before_data_write_hook();
  s.WriteData(w);
  // Written or failed: the free space shows what the batch consumed now.
  reservation.Release();
  std::string io_error = s.FailUnwritten(w);
  Status durable = s.opts.sync ? s.SyncFiles(w.touched) : Status::Ok();
  if (durable.ok() && s.opts.before_index_write_hook) s.opts.before_index_write_hook();
  // Held until the records are in memory: see index_mu.
  MutexLock index_lock(s.index_mu);
  const std::vector<bool> undeleted = s.IndexWrites(w, std::move(durable), io_error);
  if (!io_error.empty()) s.DisableWrites(io_error);

  MutexLock lock(s.mu);
  s.RecordWrites(w, undeleted);
  s.PublishGauges();
  return std::move(w.out);
}

uint64_t SsdTier::Impl::AdmitWrites(WriteRun& w, bool index_ok) {
  uint64_t incoming = 0;
  MutexLock lock(mu);
  const bool allowed = WritesAllowed(w.now) && index_ok;
  for (size_t i = 0; i < w.writes.size(); ++i) {
    const SsdWrite& write = w.writes[i];
    if (write.payload.empty() || write.payload.size() > kMaxSsdPayloadBytes) {
      w.out[i] = InvalidArgument("SSD payload must be 1 byte .. 1 GiB");
      continue;
    }
    // An extent lives in one data file: a larger one could never be
    // placed, and making room for it would empty the tier for nothing.
    if (SsdIoBytes(write.payload.size()) > space[0].capacity_bytes()) {
      w.out[i] = ResourceExhausted("SSD entry of " + std::to_string(write.payload.size()) +
                                   " bytes exceeds one data file (" +
                                   std::to_string(space[0].capacity_bytes()) +
                                   " bytes): fewer data files or more capacity would hold it");
      continue;
    }
    w.keys[i] = EncodeSsdKey(write.key);
    auto it = records.find(w.keys[i]);
    if ((it != records.end() && it->second->meta.expiry > w.now) || pending.count(w.keys[i])) {
      continue;  // stored, or being stored by another batch: idempotent
    }
    if (!allowed) {
      w.out[i] = Unavailable("SSD writes are stopped after an I/O or index error or a full disk");
      continue;
    }
    pending.insert(w.keys[i]);
    w.todo[i] = true;
    incoming += SsdIoBytes(write.payload.size());
  }
  return incoming;
}

// An entry the free space has no run for gets one made, then a second try.
void SsdTier::Impl::PlaceWrites(WriteRun& w) {
  w.metas.resize(w.writes.size());
  w.placed.assign(w.writes.size(), false);
  std::vector<size_t> no_run;
  {
    MutexLock lock(mu);
    for (size_t i = 0; i < w.writes.size(); ++i) {
      if (w.todo[i]) PlaceWrite(w, i, /*last_try=*/false, no_run);
    }
  }
  for (size_t i : no_run) {
    (void)MakeRun(SsdIoBytes(w.writes[i].payload.size()));
    MutexLock lock(mu);
    PlaceWrite(w, i, /*last_try=*/true, no_run);
  }
}

void SsdTier::Impl::PlaceWrite(WriteRun& w, size_t i, bool last_try, std::vector<size_t>& no_run) {
  const SsdWrite& write = w.writes[i];
  auto where = AllocateRun(SsdIoBytes(write.payload.size()));
  if (!where.has_value()) {
    if (!last_try) {
      no_run.push_back(i);
      return;
    }
    w.out[i] = ResourceExhausted("no room on the SSD tier for " +
                                 std::to_string(SsdIoBytes(write.payload.size())) +
                                 " bytes in one run (the entries in the way are being read)");
    pending.erase(w.keys[i]);
    w.todo[i] = false;
    return;
  }
  w.placed[i] = true;
  SsdEntryMeta& meta = w.metas[i];
  meta.file = where->first;
  meta.offset = where->second;
  meta.payload_bytes = write.payload.size();
  meta.extent_bytes = SsdIoBytes(meta.payload_bytes);
  meta.entry_checksum = write.entry_checksum;
  meta.layout_id = write.layout_id;
  meta.commit_time = write.commit_time != 0 ? write.commit_time : w.now;
  meta.expiry = w.now + opts.ttl;
  meta.last_access = w.now;
}

// The batch must leave min_free_bytes free. Only blocks never written
// count: a reused extent is allocated on disk already.
bool SsdTier::Impl::ReserveWriteRoom(WriteRun& w, Reservation& reservation) {
  uint64_t consumes = 0;
  for (size_t i = 0; i < w.writes.size(); ++i) {
    if (w.placed[i])
      consumes += UnallocatedBytes(w.metas[i].file, w.metas[i].offset, w.metas[i].extent_bytes);
  }
  bool full = false;
  Status room = ReserveFreeSpace(consumes, &reservation, &full);
  if (room.ok()) return true;
  if (full) DisableWrites(room.message());
  MutexLock lock(mu);
  for (size_t i = 0; i < w.writes.size(); ++i) {
    if (!w.placed[i]) continue;
    space[w.metas[i].file].Free(w.metas[i].offset, w.metas[i].extent_bytes);
    pending.erase(w.keys[i]);
    w.out[i] = full ? Unavailable("SSD writes are stopped: the file system is full")
                    : Unavailable("no SSD room while other batches are written: " + room.message());
  }
  return false;
}

// Checksummed before the I/O: bytes that change under it fail their
// first read rather than become a copy that vouches for them.
void SsdTier::Impl::ChecksumWrites(WriteRun& w) {
  for (size_t i = 0; i < w.writes.size(); ++i) {
    if (!w.todo[i]) continue;
    w.metas[i].data_checksum =
        KeyBoundChecksum(w.writes[i].data_checksum.has_value() ? *w.writes[i].data_checksum
                                                               : Checksum64(w.writes[i].payload),
                         w.writes[i].key);
  }
}

void SsdTier::Impl::WriteData(WriteRun& w) {
  const std::span<const SsdWrite> writes = w.writes;
  w.touched.assign(fds.size(), false);
  for (size_t i = 0; i < writes.size(); ++i) {
    if (!w.todo[i]) continue;
    const bool direct =
        IsAligned(writes[i].payload.data()) && writes[i].readable_bytes >= w.metas[i].extent_bytes;
    // The ring only reads from a direct source, never writes to it.
    auto* src = const_cast<std::byte*>(writes[i].payload.data());
    PlanOps(/*write=*/true, w.metas[i], direct ? src : nullptr, &w.ops, &w.owner, i);
    w.touched[w.metas[i].file] = true;
  }
  UringRing* ring = AcquireRing();
  ring->Run(
      w.ops,
      [&](size_t op, std::span<std::byte> buf) {
        const auto [i, off] = w.owner[op];
        const std::span<const std::byte> src = writes[i].payload;
        const uint64_t n = std::min<uint64_t>(buf.size(), src.size() - off);
        std::memcpy(buf.data(), src.data() + off, n);
        std::memset(buf.data() + n, 0, buf.size() - n);  // no stale bytes on disk
      },
      [](size_t, std::span<std::byte>) {}, [](size_t) {});
  ReleaseRing(ring);
}

std::string SsdTier::Impl::FailUnwritten(WriteRun& w) const {
  std::string io_error;
  for (size_t op = 0; op < w.ops.size(); ++op) {
    if (w.ops[op].result == static_cast<int>(w.ops[op].length)) continue;
    const size_t i = w.owner[op].first;
    // A short O_DIRECT write means the file system ran out of space.
    const int err = w.ops[op].result < 0 ? -w.ops[op].result : ENOSPC;
    if (w.todo[i]) {
      w.out[i] = Unavailable("SSD write failed: " + Errno(err));
      w.todo[i] = false;
    }
    if (io_error.empty()) io_error = paths[w.ops[op].file] + ": " + Errno(err);
  }
  return io_error;
}

std::vector<bool> SsdTier::Impl::IndexWrites(WriteRun& w, Status durable, std::string& io_error) {
  std::vector<std::pair<std::string, SsdEntryMeta>> puts;
  for (size_t i = 0; i < w.writes.size(); ++i) {
    if (w.todo[i] && durable.ok()) puts.emplace_back(w.keys[i], w.metas[i]);
  }
  // A failed put may still have reached RocksDB's log (a failed sync):
  // its extents wait for a durable delete like a retired record's.
  bool maybe_indexed = false;
  if (durable.ok() && index_failed.load()) {
    durable = Unavailable("the SSD index failed earlier");
  } else if (durable.ok()) {
    if (opts.before_index_put_hook) durable = opts.before_index_put_hook();
    if (durable.ok()) durable = index->Apply(puts, {}, opts.sync);
    if (durable.ok() && opts.after_index_put_hook) durable = opts.after_index_put_hook();
    if (!durable.ok()) {
      MarkIndexFailed();
      maybe_indexed = true;
    }
  }
  std::vector<bool> undeleted(w.writes.size(), false);
  if (!durable.ok()) {
    for (size_t i = 0; i < w.writes.size(); ++i) {
      if (w.todo[i]) {
        w.out[i] = durable;
        undeleted[i] = maybe_indexed;
      }
      w.todo[i] = false;
    }
    if (io_error.empty()) io_error = durable.ToString();
  }
  return undeleted;
}

void SsdTier::Impl::RecordWrites(const WriteRun& w, const std::vector<bool>& undeleted_puts) {
  // Last to first: a batch lists a chain root first, and the root must be
  // the youngest (Record::order).
  for (size_t i = w.writes.size(); i-- > 0;) {
    if (!w.placed[i]) continue;
    const std::string& key = w.keys[i];
    pending.erase(key);
    if (undeleted_puts[i]) {
      // An expired entry under the same key goes too: the put may have
      // overwritten its index entry, and left in memory it would pass for a
      // rewrite, so the retried delete would skip the key and leave the new
      // entry indexed over a freed extent. One delete covers both.
      if (RecordPtr old = Retire(key)) {
        undeleted.emplace_back(key, std::move(old));
      }
      auto rec = std::make_shared<Record>();
      rec->meta = w.metas[i];
      rec->retired = true;
      undeleted.emplace_back(key, std::move(rec));
      continue;
    }
    if (!w.todo[i]) {
      // Never indexed: the extent can be reused at once.
      space[w.metas[i].file].Free(w.metas[i].offset, w.metas[i].extent_bytes);
      continue;
    }
    auto rec = std::make_shared<Record>();
    rec->meta = w.metas[i];
    rec->persisted_access = w.now;
    models[w.writes[i].key.ns].insert(w.writes[i].key.model_id);
    auto [slot, added] = records.try_emplace(key);
    if (!added) {
      // An expired entry under the same key: the put just overwrote its
      // index entry, so its extent goes once no reader holds it.
      Record& old = *slot->second;
      UnindexRecord(old);
      old.retired = true;
      old.index_gone = true;
      MaybeFree(old);
    }
    PlaceNew(key, *rec);
    rec->order = NextOrder();
    slot->second = std::move(rec);
    IndexRecord(slot->first, *slot->second);
    bytes_written += w.metas[i].payload_bytes;
    m.bytes_written->Increment(w.metas[i].payload_bytes);
  }
}

Status SsdTier::Write(const SsdWrite& write) { return WriteBatch({&write, 1}).front(); }

}  // namespace strata
