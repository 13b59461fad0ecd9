// The read path: pinned records, O_DIRECT reads, verified against the
// payload checksum (a mismatch drops the entry).
#include "ssd/ssd_tier_impl.h"
#include "util/mutex.h"

namespace strata {

std::vector<Status> SsdTier::ReadBatch(std::span<const SsdRead> reads) {
  Impl& s = *impl_;
  std::vector<Status> out(reads.size(), Status::Ok());
  std::vector<std::string> keys(reads.size());
  std::vector<RecordPtr> recs(reads.size());
  const Nanos now = s.clock->Now();
  {
    MutexLock lock(s.mu);
    for (size_t i = 0; i < reads.size(); ++i) {
      keys[i] = EncodeSsdKey(reads[i].key);
      auto it = s.records.find(keys[i]);
      if (it == s.records.end() || it->second->meta.expiry <= now) {
        out[i] = NotFound("not on the SSD tier");
        continue;
      }
      if (reads[i].dst.size() < it->second->meta.payload_bytes) {
        out[i] = InvalidArgument("read buffer smaller than the payload");
        continue;
      }
      recs[i] = it->second;
      ++recs[i]->readers;
    }
  }
  std::vector<IoOp> ops;
  std::vector<std::pair<size_t, uint64_t>> owner;
  std::vector<uint32_t> ops_left(reads.size(), 0);
  std::vector<bool> io_ok(reads.size(), true), sum_ok(reads.size(), false);
  for (size_t i = 0; i < reads.size(); ++i) {
    if (recs[i] == nullptr) continue;
    std::byte* dst = reads[i].dst.data();
    const bool direct = IsAligned(dst) && reads[i].dst.size() >= recs[i]->meta.extent_bytes;
    const size_t before = ops.size();
    s.PlanOps(/*write=*/false, recs[i]->meta, direct ? dst : nullptr, &ops, &owner, i);
    ops_left[i] = static_cast<uint32_t>(ops.size() - before);
  }
  if (!ops.empty()) {
    UringRing* ring = s.AcquireRing();
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
            sum_ok[i] = KeyBoundChecksum(Checksum64(reads[i].dst.first(meta.payload_bytes)),
                                         reads[i].key) == meta.data_checksum;
          }
        });
    s.ReleaseRing(ring);
  }
  std::vector<bool> bad_io(reads.size(), false);
  for (size_t op = 0; op < ops.size(); ++op) {
    const size_t i = owner[op].first;
    const IoOp& io = ops[op];
    if (io.result == static_cast<int>(io.length) || !out[i].ok()) continue;
    const std::string why = io.result >= 0 ? "short read, " + std::to_string(io.result) + " of " +
                                                 std::to_string(io.length) + " bytes"
                                           : Errno(-io.result);
    // A short read or a media error from the device: the bytes are gone, as
    // with a checksum mismatch, and keeping the entry would make every match
    // a hit whose promotion fails. A failed ring, EAGAIN or ENOMEM says
    // nothing about them: the entry stays.
    if (io.completed &&
        (io.result >= 0 || io.result == -EIO || io.result == -ENODATA || io.result == -EILSEQ)) {
      spdlog::warn("ssd: reading {} at offset {} failed ({}); entry dropped", s.paths[io.file],
                   io.offset, why);
      out[i] = NotFound("SSD read failed (" + why + "); entry dropped");
      bad_io[i] = true;
    } else {
      out[i] = Unavailable("SSD read failed: " + why);
    }
  }
  // Verify every payload; a mismatch is never served.
  for (size_t i = 0; i < reads.size(); ++i) {
    if (recs[i] == nullptr || !out[i].ok()) continue;
    const SsdEntryMeta& meta = recs[i]->meta;
    if (!sum_ok[i]) {
      spdlog::warn("ssd: checksum mismatch in {} at offset {}; entry dropped", s.paths[meta.file],
                   meta.offset);
      {
        MutexLock lock(s.mu);
        ++s.checksum_failures;
      }
      s.m.checksum_failures->Increment();
      out[i] = NotFound("SSD entry failed its checksum and was dropped");
      continue;
    }
    s.m.bytes_read->Increment(meta.payload_bytes);
  }
  std::vector<std::pair<std::string, RecordPtr>> access_puts;
  std::vector<std::tuple<std::string, RecordPtr, Counter*>> to_drop;
  {
    MutexLock lock(s.mu);
    for (size_t i = reads.size(); i-- > 0;) {  // root last: see Record::order
      if (recs[i] == nullptr) continue;
      Record& r = *recs[i];
      --r.readers;
      if (out[i].ok()) {
        s.bytes_read += r.meta.payload_bytes;
        s.Reorder(r, [&] {
          r.meta.last_access = now;
          r.order = s.NextOrder();
        });
        if (!r.retired && now - r.persisted_access >= s.opts.access_persist_interval) {
          r.persisted_access = now;
          access_puts.emplace_back(keys[i], recs[i]);
        }
      } else if (out[i].code() == StatusCode::kNotFound) {
        to_drop.emplace_back(keys[i], recs[i], bad_io[i] ? s.m.evict_io_error : s.m.evict_checksum);
      }
      s.MaybeFree(r);
    }
  }
  for (const auto& [k, r, reason] : to_drop) s.Drop(k, r, reason);
  if (!access_puts.empty() && !s.index_failed.load()) {
    // Only records still current: one deleted or rewritten since the read
    // keeps what its delete or rewrite wrote. A hint: never worth waiting
    // for another batch's synced index write (a promotion is waiting on us).
    if (!s.index_mu.try_lock()) return out;  // the hints wait for the next read
    MutexLock index_lock(s.index_mu, std::adopt_lock);
    std::vector<std::pair<std::string, SsdEntryMeta>> puts;
    if (!s.index_failed.load()) {
      MutexLock lock(s.mu);
      for (const auto& [k, r] : access_puts) {
        auto it = s.records.find(k);
        if (it != s.records.end() && it->second == r && !r->retired) puts.emplace_back(k, r->meta);
      }
    }
    Status st;
    if (!puts.empty() && s.opts.before_index_put_hook) st = s.opts.before_index_put_hook();
    if (!puts.empty() && st.ok()) st = s.index->Apply(puts, {}, /*sync=*/false);
    // Nor does its failure fail the index: if RocksDB is in trouble, the
    // next real write finds out (and the index recovers from there).
    if (!st.ok()) spdlog::warn("ssd: persisting access times failed: {}", st.ToString());
  }
  return out;
}

Status SsdTier::Read(const SsdRead& read) { return ReadBatch({&read, 1}).front(); }

}  // namespace strata
