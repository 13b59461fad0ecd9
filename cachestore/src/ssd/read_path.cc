// The read path: pinned records, O_DIRECT reads, verified against the
// payload checksum (a mismatch drops the entry).
#include "ssd/ssd_tier_impl.h"
#include "util/mutex.h"

namespace strata {

std::vector<Status> SsdTier::ReadBatch(std::span<const SsdRead> reads) {
  Impl& s = *impl_;
  Impl::ReadRun r(reads);
  r.now = s.clock->Now();
  s.PinReads(r);
  s.ReadData(r);
  s.FailBadReads(r);
  // Verify every payload; a mismatch is never served.
  s.FailMismatches(r);
  std::vector<std::pair<std::string, RecordPtr>> access_puts;
  std::vector<std::tuple<std::string, RecordPtr, Counter*>> to_drop;
  s.UnpinReads(r, access_puts, to_drop);
  for (const auto& [k, rec, reason] : to_drop) s.Drop(k, rec, reason);
  if (!access_puts.empty() && !s.index_failed.load()) s.PersistAccessTimes(access_puts);
  return std::move(r.out);
}

void SsdTier::Impl::PinReads(ReadRun& r) {
  MutexLock lock(mu);
  for (size_t i = 0; i < r.reads.size(); ++i) {
    r.keys[i] = EncodeSsdKey(r.reads[i].key);
    auto it = records.find(r.keys[i]);
    if (it == records.end() || it->second->meta.expiry <= r.now) {
      r.out[i] = NotFound("not on the SSD tier");
      continue;
    }
    if (r.reads[i].dst.size() < it->second->meta.payload_bytes) {
      r.out[i] = InvalidArgument("read buffer smaller than the payload");
      continue;
    }
    r.recs[i] = it->second;
    ++r.recs[i]->readers;
  }
}

void SsdTier::Impl::ReadData(ReadRun& r) {
  const std::span<const SsdRead> reads = r.reads;
  const std::vector<RecordPtr>& recs = r.recs;
  std::vector<IoOp>& ops = r.ops;
  std::vector<std::pair<size_t, uint64_t>>& owner = r.owner;
  std::vector<uint32_t> ops_left(reads.size(), 0);
  std::vector<bool> io_ok(reads.size(), true);
  r.sum_ok.assign(reads.size(), false);
  for (size_t i = 0; i < reads.size(); ++i) {
    if (recs[i] == nullptr) continue;
    std::byte* dst = reads[i].dst.data();
    const bool direct = IsAligned(dst) && reads[i].dst.size() >= recs[i]->meta.extent_bytes;
    const size_t before = ops.size();
    PlanOps(/*write=*/false, recs[i]->meta, direct ? dst : nullptr, &ops, &owner, i);
    ops_left[i] = static_cast<uint32_t>(ops.size() - before);
  }
  if (ops.empty()) return;
  UringRing* ring = AcquireRing();
  ring->Run(
      ops, [](size_t, std::span<std::byte>) {},
      [&](size_t op, std::span<std::byte> buf) {
        const auto [i, off] = owner[op];
        const uint64_t payload = recs[i]->meta.payload_bytes;
        std::memcpy(reads[i].dst.data() + off, buf.data(),
                    std::min<uint64_t>(buf.size(), payload - off));
      },
      [&](size_t op) {
        // Verify each entry as soon as its last op lands, while the rest
        // of the batch is still in flight.
        const size_t i = owner[op].first;
        if (ops[op].result != static_cast<int>(ops[op].length)) io_ok[i] = false;
        if (--ops_left[i] == 0 && io_ok[i]) {
          const SsdEntryMeta& meta = recs[i]->meta;
          r.sum_ok[i] = KeyBoundChecksum(Checksum64(reads[i].dst.first(meta.payload_bytes)),
                                         reads[i].key) == meta.data_checksum;
        }
      });
  ReleaseRing(ring);
}

void SsdTier::Impl::FailBadReads(ReadRun& r) const {
  r.bad_io.assign(r.reads.size(), false);
  for (size_t op = 0; op < r.ops.size(); ++op) {
    const size_t i = r.owner[op].first;
    const IoOp& io = r.ops[op];
    if (io.result == static_cast<int>(io.length) || !r.out[i].ok()) continue;
    const std::string why = io.result >= 0 ? "short read, " + std::to_string(io.result) + " of " +
                                                 std::to_string(io.length) + " bytes"
                                           : Errno(-io.result);
    // A short read or a media error from the device: the bytes are gone, as
    // with a checksum mismatch, and keeping the entry would make every match
    // a hit whose promotion fails. A failed ring, EAGAIN or ENOMEM says
    // nothing about them: the entry stays.
    if (io.completed &&
        (io.result >= 0 || io.result == -EIO || io.result == -ENODATA || io.result == -EILSEQ)) {
      spdlog::warn("ssd: reading {} at offset {} failed ({}); entry dropped", paths[io.file],
                   io.offset, why);
      r.out[i] = NotFound("SSD read failed (" + why + "); entry dropped");
      r.bad_io[i] = true;
    } else {
      r.out[i] = Unavailable("SSD read failed: " + why);
    }
  }
}

void SsdTier::Impl::FailMismatches(ReadRun& r) {
  for (size_t i = 0; i < r.reads.size(); ++i) {
    if (r.recs[i] == nullptr || !r.out[i].ok()) continue;
    const SsdEntryMeta& meta = r.recs[i]->meta;
    if (!r.sum_ok[i]) {
      spdlog::warn("ssd: checksum mismatch in {} at offset {}; entry dropped", paths[meta.file],
                   meta.offset);
      {
        MutexLock lock(mu);
        ++checksum_failures;
      }
      m.checksum_failures->Increment();
      r.out[i] = NotFound("SSD entry failed its checksum and was dropped");
      continue;
    }
    m.bytes_read->Increment(meta.payload_bytes);
  }
}

void SsdTier::Impl::UnpinReads(const ReadRun& r,
                               std::vector<std::pair<std::string, RecordPtr>>& access_puts,
                               std::vector<std::tuple<std::string, RecordPtr, Counter*>>& to_drop) {
  MutexLock lock(mu);
  for (size_t i = r.reads.size(); i-- > 0;) {  // root last: see Record::order
    if (r.recs[i] == nullptr) continue;
    Record& rec = *r.recs[i];
    --rec.readers;
    if (r.out[i].ok()) {
      bytes_read += rec.meta.payload_bytes;
      Reorder(rec, [&] {
        rec.meta.last_access = r.now;
        rec.order = NextOrder();
      });
      if (!rec.retired && r.now - rec.persisted_access >= opts.access_persist_interval) {
        rec.persisted_access = r.now;
        access_puts.emplace_back(r.keys[i], r.recs[i]);
      }
    } else if (r.out[i].code() == StatusCode::kNotFound) {
      to_drop.emplace_back(r.keys[i], r.recs[i], r.bad_io[i] ? m.evict_io_error : m.evict_checksum);
    }
    MaybeFree(rec);
  }
}

void SsdTier::Impl::PersistAccessTimes(
    const std::vector<std::pair<std::string, RecordPtr>>& access_puts) {
  // Only records still current: one deleted or rewritten since the read
  // keeps what its delete or rewrite wrote. A hint: never worth waiting
  // for another batch's synced index write (a promotion is waiting on us).
  if (!index_mu.try_lock()) return;  // the hints wait for the next read
  MutexLock index_lock(index_mu, std::adopt_lock);
  std::vector<std::pair<std::string, SsdEntryMeta>> puts;
  if (!index_failed.load()) {
    MutexLock lock(mu);
    for (const auto& [k, r] : access_puts) {
      auto it = records.find(k);
      if (it != records.end() && it->second == r && !r->retired) puts.emplace_back(k, r->meta);
    }
  }
  Status st;
  if (!puts.empty() && opts.before_index_put_hook) st = opts.before_index_put_hook();
  if (!puts.empty() && st.ok()) st = index->Apply(puts, {}, /*sync=*/false);
  // Nor does its failure fail the index: if RocksDB is in trouble, the
  // next real write finds out (and the index recovers from there).
  if (!st.ok()) spdlog::warn("ssd: persisting access times failed: {}", st.ToString());
}

Status SsdTier::Read(const SsdRead& read) { return ReadBatch({&read, 1}).front(); }

}  // namespace strata
