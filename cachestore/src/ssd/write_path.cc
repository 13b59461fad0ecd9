// The write path: data first (and synced), then the index entries.
#include "ssd/ssd_tier_impl.h"
#include "util/mutex.h"

namespace strata {

std::vector<Status> SsdTier::WriteBatch(std::span<const SsdWrite> writes) {
  Impl& s = *impl_;
  std::vector<Status> out(writes.size(), Status::Ok());
  std::vector<std::string> keys(writes.size());
  std::vector<bool> todo(writes.size(), false);
  uint64_t incoming = 0;
  const Nanos now = s.clock->Now();
  const bool index_ok = s.RecoverIndex();
  {
    MutexLock lock(s.mu);
    const bool allowed = s.WritesAllowed(now) && index_ok;
    for (size_t i = 0; i < writes.size(); ++i) {
      const SsdWrite& w = writes[i];
      if (w.payload.empty() || w.payload.size() > kMaxSsdPayloadBytes) {
        out[i] = InvalidArgument("SSD payload must be 1 byte .. 1 GiB");
        continue;
      }
      // An extent lives in one data file: a larger one could never be
      // placed, and making room for it would empty the tier for nothing.
      if (SsdIoBytes(w.payload.size()) > s.space[0].capacity_bytes()) {
        out[i] = ResourceExhausted("SSD entry of " + std::to_string(w.payload.size()) +
                                   " bytes exceeds one data file (" +
                                   std::to_string(s.space[0].capacity_bytes()) +
                                   " bytes): fewer data files or more capacity would hold it");
        continue;
      }
      keys[i] = EncodeSsdKey(w.key);
      auto it = s.records.find(keys[i]);
      if ((it != s.records.end() && it->second->meta.expiry > now) || s.pending.count(keys[i])) {
        continue;  // stored, or being stored by another batch: idempotent
      }
      if (!allowed) {
        out[i] = Unavailable("SSD writes are stopped after an I/O or index error or a full disk");
        continue;
      }
      s.pending.insert(keys[i]);
      todo[i] = true;
      incoming += SsdIoBytes(w.payload.size());
    }
  }
  if (incoming == 0) return out;
  s.MakeRoom(incoming, /*ttl=*/false);

  // Place every entry, then write them all in one pass over a ring. An
  // entry the free space has no run for gets one made, then a second try.
  std::vector<SsdEntryMeta> metas(writes.size());
  std::vector<bool> placed(writes.size(), false);
  std::vector<size_t> no_run;
  auto place = [&](size_t i, bool last_try) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    auto where = s.AllocateRun(SsdIoBytes(writes[i].payload.size()));
    if (!where.has_value()) {
      if (!last_try) {
        no_run.push_back(i);
        return;
      }
      out[i] = ResourceExhausted("no room on the SSD tier for " +
                                 std::to_string(SsdIoBytes(writes[i].payload.size())) +
                                 " bytes in one run (the entries in the way are being read)");
      s.pending.erase(keys[i]);
      todo[i] = false;
      return;
    }
    placed[i] = true;
    SsdEntryMeta& m = metas[i];
    m.file = where->first;
    m.offset = where->second;
    m.payload_bytes = writes[i].payload.size();
    m.extent_bytes = SsdIoBytes(m.payload_bytes);
    m.entry_checksum = writes[i].entry_checksum;
    m.layout_id = writes[i].layout_id;
    m.commit_time = writes[i].commit_time != 0 ? writes[i].commit_time : now;
    m.expiry = now + s.opts.ttl;
    m.last_access = now;
  };
  {
    MutexLock lock(s.mu);
    for (size_t i = 0; i < writes.size(); ++i) {
      if (todo[i]) place(i, /*last_try=*/false);
    }
  }
  for (size_t i : no_run) {
    (void)s.MakeRun(SsdIoBytes(writes[i].payload.size()));
    MutexLock lock(s.mu);
    place(i, /*last_try=*/true);
  }
  // The batch must leave min_free_bytes free. Only blocks never written
  // count: a reused extent is allocated on disk already.
  uint64_t consumes = 0;
  for (size_t i = 0; i < writes.size(); ++i) {
    if (placed[i])
      consumes += s.UnallocatedBytes(metas[i].file, metas[i].offset, metas[i].extent_bytes);
  }
  Impl::Reservation reservation(s);
  bool full = false;
  if (Status room = s.ReserveFreeSpace(consumes, &reservation, &full); !room.ok()) {
    if (full) s.DisableWrites(room.message());
    MutexLock lock(s.mu);
    for (size_t i = 0; i < writes.size(); ++i) {
      if (!placed[i]) continue;
      s.space[metas[i].file].Free(metas[i].offset, metas[i].extent_bytes);
      s.pending.erase(keys[i]);
      out[i] = full ? Unavailable("SSD writes are stopped: the file system is full")
                    : Unavailable("no SSD room while other batches are written: " + room.message());
    }
    return out;
  }
  // Checksummed before the I/O: bytes that change under it fail their
  // first read rather than become a copy that vouches for them.
  for (size_t i = 0; i < writes.size(); ++i) {
    if (!todo[i]) continue;
    metas[i].data_checksum =
        KeyBoundChecksum(writes[i].data_checksum.has_value() ? *writes[i].data_checksum
                                                             : Checksum64(writes[i].payload),
                         writes[i].key);
  }
  if (s.opts.before_data_write_hook) s.opts.before_data_write_hook();
  std::vector<IoOp> ops;
  std::vector<std::pair<size_t, uint64_t>> owner;  // op -> (write, offset in payload)
  std::vector<bool> touched(s.fds.size(), false);
  for (size_t i = 0; i < writes.size(); ++i) {
    if (!todo[i]) continue;
    const bool direct =
        IsAligned(writes[i].payload.data()) && writes[i].readable_bytes >= metas[i].extent_bytes;
    // The ring only reads from a direct source, never writes to it.
    auto* src = const_cast<std::byte*>(writes[i].payload.data());
    s.PlanOps(/*write=*/true, metas[i], direct ? src : nullptr, &ops, &owner, i);
    touched[metas[i].file] = true;
  }
  UringRing* ring = s.AcquireRing();
  ring->Run(
      ops,
      [&](size_t op, std::span<std::byte> buf) {
        const auto [i, off] = owner[op];
        const std::span<const std::byte> src = writes[i].payload;
        const uint64_t n = std::min<uint64_t>(buf.size(), src.size() - off);
        std::memcpy(buf.data(), src.data() + off, n);
        std::memset(buf.data() + n, 0, buf.size() - n);  // no stale bytes on disk
      },
      [](size_t, std::span<std::byte>) {}, [](size_t) {});
  s.ReleaseRing(ring);
  // Written or failed: the free space shows what the batch consumed now.
  reservation.Release();

  std::string io_error;
  for (size_t op = 0; op < ops.size(); ++op) {
    if (ops[op].result == static_cast<int>(ops[op].length)) continue;
    const size_t i = owner[op].first;
    // A short O_DIRECT write means the file system ran out of space.
    const int err = ops[op].result < 0 ? -ops[op].result : ENOSPC;
    if (todo[i]) {
      out[i] = Unavailable("SSD write failed: " + Errno(err));
      todo[i] = false;
    }
    if (io_error.empty()) io_error = s.paths[ops[op].file] + ": " + Errno(err);
  }
  Status durable = s.opts.sync ? s.SyncFiles(touched) : Status::Ok();
  if (durable.ok() && s.opts.before_index_write_hook) s.opts.before_index_write_hook();
  // Held until the records are in memory: see index_mu.
  MutexLock index_lock(s.index_mu);
  std::vector<std::pair<std::string, SsdEntryMeta>> puts;
  for (size_t i = 0; i < writes.size(); ++i) {
    if (todo[i] && durable.ok()) puts.emplace_back(keys[i], metas[i]);
  }
  // A failed put may still have reached RocksDB's log (a failed sync):
  // its extents wait for a durable delete like a retired record's.
  bool maybe_indexed = false;
  if (durable.ok() && s.index_failed.load()) {
    durable = Unavailable("the SSD index failed earlier");
  } else if (durable.ok()) {
    if (s.opts.before_index_put_hook) durable = s.opts.before_index_put_hook();
    if (durable.ok()) durable = s.index->Apply(puts, {}, s.opts.sync);
    if (durable.ok() && s.opts.after_index_put_hook) durable = s.opts.after_index_put_hook();
    if (!durable.ok()) {
      s.MarkIndexFailed();
      maybe_indexed = true;
    }
  }
  std::vector<bool> undeleted(writes.size(), false);
  if (!durable.ok()) {
    for (size_t i = 0; i < writes.size(); ++i) {
      if (todo[i]) {
        out[i] = durable;
        undeleted[i] = maybe_indexed;
      }
      todo[i] = false;
    }
    if (io_error.empty()) io_error = durable.ToString();
  }
  if (!io_error.empty()) s.DisableWrites(io_error);

  MutexLock lock(s.mu);
  // Last to first: a batch lists a chain root first, and the root must be
  // the youngest (Record::order).
  for (size_t i = writes.size(); i-- > 0;) {
    if (!placed[i]) continue;
    s.pending.erase(keys[i]);
    if (undeleted[i]) {
      // An expired entry under the same key goes too: the put may have
      // overwritten its index entry, and left in memory it would pass for a
      // rewrite, so the retried delete would skip the key and leave the new
      // entry indexed over a freed extent. One delete covers both.
      if (RecordPtr old = s.Retire(keys[i])) {
        s.undeleted.emplace_back(keys[i], std::move(old));
      }
      auto rec = std::make_shared<Record>();
      rec->meta = metas[i];
      rec->retired = true;
      s.undeleted.emplace_back(keys[i], std::move(rec));
      continue;
    }
    if (!todo[i]) {
      // Never indexed: the extent can be reused at once.
      s.space[metas[i].file].Free(metas[i].offset, metas[i].extent_bytes);
      continue;
    }
    auto rec = std::make_shared<Record>();
    rec->meta = metas[i];
    rec->persisted_access = now;
    s.models[writes[i].key.ns].insert(writes[i].key.model_id);
    auto [slot, added] = s.records.try_emplace(keys[i]);
    if (!added) {
      // An expired entry under the same key: the put just overwrote its
      // index entry, so its extent goes once no reader holds it.
      Record& old = *slot->second;
      s.UnindexRecord(old);
      old.retired = true;
      old.index_gone = true;
      s.MaybeFree(old);
    }
    s.PlaceNew(keys[i], *rec);
    rec->order = s.NextOrder();
    slot->second = std::move(rec);
    s.IndexRecord(slot->first, *slot->second);
    s.bytes_written += metas[i].payload_bytes;
    s.m.bytes_written->Increment(metas[i].payload_bytes);
  }
  s.PublishGauges();
  return out;
}

Status SsdTier::Write(const SsdWrite& write) { return WriteBatch({&write, 1}).front(); }

}  // namespace strata
