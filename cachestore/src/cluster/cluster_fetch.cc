// Fetch across the cluster: each block from the first replica that reported
// it, failed blocks from the next, within the deadline.
#include "cluster/cluster_store_impl.h"
#include "format/fetch_prefix.h"
#include "util/mutex.h"

namespace strata {

FetchOutcome ClusterStore::FetchNow(const FetchRequest& req) {
  FetchOutcome out;
  bool want_swa = false;
  out.status = CheckFetchRequest(req, &want_swa);
  if (!out.status.ok()) return out;
  const MatchResult& match = *req.match;
  const size_t n = req.block_buffers.size();
  if (n == 0 && !want_swa) return out;
  const Nanos deadline = SteadyClock().Now() + 3 * call_timeout_;

  // Replicas are only good under their leases: take them if the match did not.
  std::shared_ptr<const ReadLease> lease;
  LeaseId own_lease = 0;
  if (match.lease != 0) {
    MutexLock lock(leases_mu_);
    if (auto it = read_leases_.find(match.lease); it != read_leases_.end()) lease = it->second;
  }
  if (lease == nullptr && match.lease != 0) {
    // The match's lease was released or expired: as a node would, say so
    // rather than lease the blocks again behind the caller's back.
    out.status =
        LeaseExpired("lease " + std::to_string(match.lease) + " is not live (expired or released)");
    return out;
  }
  if (lease == nullptr) {
    Result<MatchResult> r = MatchAgainWithLease(*this, match, n, want_swa);
    if (!r.ok()) {
      out.status = r.status();
      return out;
    }
    own_lease = r->lease;
    MutexLock lock(leases_mu_);
    if (auto it = read_leases_.find(own_lease); it != read_leases_.end()) lease = it->second;
  }
  if (lease == nullptr) {
    out.status = NotFound("block 0 is no longer stored");
    return out;
  }
  FetchFromReplicas(req, match, *lease, n, want_swa, deadline, out);
  if (own_lease != 0) (void)Abort(own_lease);
  return out;
}

// One sub-fetch per node, of the blocks it serves this round.
struct ClusterStore::SubFetch {
  std::shared_ptr<NodeConn> node;
  MatchResult match;
  std::vector<size_t> positions;
  std::vector<std::span<std::byte>> buffers;
  bool swa = false;
  FetchOutcome outcome;
};

// One FetchFromReplicas: each block's replicas, the next one to try, and
// what arrived.
struct ClusterStore::ReplicaFetch {
  ReplicaFetch(const FetchRequest& request, const MatchResult& matched, const ReadLease& read_lease,
               size_t blocks, bool swa_wanted);
  ReplicaFetch(const ReplicaFetch&) = delete;
  ReplicaFetch& operator=(const ReplicaFetch&) = delete;

  // The sub-fetches of the next round: each block not arrived yet, up to
  // the first with no replica left, from its next replica.
  std::vector<SubFetch> PlanRound();
  SubFetch& SubFor(std::vector<SubFetch>& subs, const Holder& h) const;
  // What the round's sub-fetches delivered, and why the rest did not arrive.
  void TakeOutcomes(const std::vector<SubFetch>& subs);
  size_t FirstMissing() const;
  bool SwaLeft();
  // The prefix that arrived, its bytes, and the last events.
  void Finish(FetchOutcome& out);

  const FetchRequest& req;
  const MatchResult& match;
  const ReadLease& lease;
  const size_t n;
  const bool want_swa;
  std::vector<std::vector<const Holder*>> candidates;
  std::vector<const Holder*> swa_candidates;
  size_t next_swa = 0;
  // A block retried after some of its groups were reported ready lands in
  // scratch: the caller may be reading those groups already, so only the
  // groups not yet reported are copied over once the block verified.
  std::vector<std::vector<std::byte>> scratch;
  std::vector<size_t> next;  // next candidate to try, per block
  std::vector<bool> done;
  std::vector<Status> why;
  bool swa_done = false;
  Status swa_why = NotFound("SWA state is no longer stored");
  FetchEvents events;
};

void ClusterStore::FetchFromReplicas(const FetchRequest& req, const MatchResult& match,
                                     const ReadLease& lease, size_t n, bool want_swa,
                                     Nanos deadline, FetchOutcome& out) {
  ReplicaFetch fetch(req, match, lease, n, want_swa);
  for (;;) {
    std::vector<SubFetch> subs = fetch.PlanRound();
    if (subs.empty()) break;
    RunSubFetches(req, subs, fetch.events, fetch.scratch);
    fetch.TakeOutcomes(subs);
    const size_t missing = fetch.FirstMissing();
    const bool swa_left = fetch.SwaLeft();
    if (missing == n && !swa_left) break;
    if (SteadyClock().Now() + call_timeout_ > deadline) {
      if (missing < n) {
        fetch.why[missing] = DeadlineExceeded("no time left to try another replica (" +
                                              fetch.why[missing].message() + ")");
      }
      break;
    }
  }
  fetch.Finish(out);
}

// A replica serves a block only if it reported the very block matched.
ClusterStore::ReplicaFetch::ReplicaFetch(const FetchRequest& request, const MatchResult& matched,
                                         const ReadLease& read_lease, size_t blocks,
                                         bool swa_wanted)
    : req(request),
      match(matched),
      lease(read_lease),
      n(blocks),
      want_swa(swa_wanted),
      candidates(n),
      scratch(n),
      next(n, 0),
      done(n, false),
      why(n),
      events(req.on_event, n) {
  for (size_t b = 0; b < n && b < lease.holders.size(); ++b) {
    for (const Holder& h : lease.holders[b]) {
      if (h.block.key == match.blocks[b].key && h.block.checksum == match.blocks[b].checksum &&
          h.block.payload_bytes == match.blocks[b].payload_bytes) {
        candidates[b].push_back(&h);
      }
    }
  }
  for (const Holder& h : lease.swa) {
    if (want_swa && h.block.key == match.swa->entry.key &&
        h.block.checksum == match.swa->entry.checksum) {
      swa_candidates.push_back(&h);
    }
  }
}

std::vector<ClusterStore::SubFetch> ClusterStore::ReplicaFetch::PlanRound() {
  // The prefix cannot reach past a block with no replica left.
  size_t reachable = n;
  for (size_t b = 0; b < n; ++b) {
    if (!done[b] && next[b] >= candidates[b].size()) {
      reachable = b;
      break;
    }
  }
  std::vector<SubFetch> subs;
  for (size_t b = 0; b < reachable; ++b) {
    if (done[b]) continue;
    const Holder& h = *candidates[b][next[b]++];
    SubFetch& s = SubFor(subs, h);
    s.match.blocks.push_back(h.block);
    s.positions.push_back(b);
    if (events.AnyGroup(b)) scratch[b].resize(req.block_buffers[b].size());
    s.buffers.push_back(scratch[b].empty() ? req.block_buffers[b] : scratch[b]);
  }
  // Never again into a buffer the caller may be reading.
  if (!swa_done && !events.SwaReported() && next_swa < swa_candidates.size()) {
    const Holder& h = *swa_candidates[next_swa++];
    SubFetch& s = SubFor(subs, h);
    // Boundary 0: the node fetches it whatever its share of the prefix
    // (CheckFetchRequest asks for the blocks up to the boundary);
    // whether it belongs to the usable prefix is decided here.
    s.match.swa = SwaMatch{0, h.block};
    s.swa = true;
  }
  return subs;
}

// The round's sub-fetch for h's node and lease, added if it has none yet.
ClusterStore::SubFetch& ClusterStore::ReplicaFetch::SubFor(std::vector<SubFetch>& subs,
                                                           const Holder& h) const {
  for (SubFetch& s : subs) {
    if (s.node == h.node && s.match.lease == h.lease) return s;
  }
  SubFetch& s = subs.emplace_back();
  s.node = h.node;
  s.match.model_id = match.model_id;
  s.match.block_tokens = match.block_tokens;
  s.match.lease = h.lease;
  s.match.lease_expiry = lease.expiry;
  return s;
}

void ClusterStore::RunSubFetches(const FetchRequest& req, std::vector<SubFetch>& subs,
                                 FetchEvents& events,
                                 std::vector<std::vector<std::byte>>& scratch) {
  std::vector<std::function<void()>> tasks;
  tasks.reserve(subs.size());
  for (SubFetch& s : subs) {
    tasks.emplace_back([&s, &req, &events, &scratch, this] {
      FetchRequest sub;
      sub.match = &s.match;
      sub.block_buffers = s.buffers;
      if (s.swa) sub.swa_buffer = req.swa_buffer;
      sub.on_event = [&s, &events, &scratch](const FetchEvent& e) {
        if (e.type == FetchEvent::Type::kSwaReady) {
          if (s.swa) events.Swa();
          return;
        }
        // Blocks going to scratch are reported once copied over.
        if (e.block >= s.positions.size() || !scratch[s.positions[e.block]].empty()) return;
        if (e.type == FetchEvent::Type::kGroupReady) events.Group(s.positions[e.block], e.group);
        if (e.type == FetchEvent::Type::kBlockReady) events.Block(s.positions[e.block]);
      };
      // The outcome's status, or why the node was not asked.
      s.outcome.status = OnNode(*s.node, kReads, [&](NodeClient& client) {
        s.outcome = client.Fetch(sub).Wait();
        return s.outcome.status;
      });
    });
  }
  pool_.RunAll(std::move(tasks));
}

void ClusterStore::ReplicaFetch::TakeOutcomes(const std::vector<SubFetch>& subs) {
  for (const SubFetch& s : subs) {
    for (size_t j = 0; j < s.positions.size(); ++j) {
      const size_t b = s.positions[j];
      if (j < s.outcome.blocks_ready) {
        done[b] = true;
        if (!scratch[b].empty()) {
          if (Status st = CopyUnreportedGroups(scratch[b], req.block_buffers[b], b, events);
              !st.ok()) {
            done[b] = false;
            why[b] = st;
          }
          scratch[b] = {};
        }
      } else {
        why[b] = s.outcome.status.ok() ? Internal("block did not complete") : s.outcome.status;
      }
    }
    if (s.swa) {
      swa_done = s.outcome.swa_ready;
      if (!swa_done) {
        swa_why = s.outcome.status.ok() ? NotFound("SWA state did not arrive") : s.outcome.status;
      }
    }
  }
}

// The first block that has not arrived; n when all have.
size_t ClusterStore::ReplicaFetch::FirstMissing() const {
  for (size_t b = 0; b < n; ++b) {
    if (!done[b]) return b;
  }
  return n;
}

// Whether the SWA state is still to arrive, and has a replica left to try.
bool ClusterStore::ReplicaFetch::SwaLeft() {
  return !swa_done && !events.SwaReported() && next_swa < swa_candidates.size();
}

void ClusterStore::ReplicaFetch::Finish(FetchOutcome& out) {
  FetchPrefix prefix(n, want_swa ? std::optional(match.swa->boundary_blocks) : std::nullopt);
  for (size_t b = 0; b < n; ++b) {
    if (done[b]) continue;
    prefix.CutBlock(b, why[b].ok() ? NotFound("no replica holds it") : why[b]);
    break;
  }
  // Arrived, the state falls only with its prefix, whose failure is reported.
  if (want_swa && !(swa_done && prefix.SwaCovered())) {
    prefix.Report(Status(swa_why.code(), "SWA state: " + swa_why.message()));
  }
  prefix.Finish(swa_done, out);
  for (size_t b = 0; b < out.blocks_ready; ++b) out.bytes += match.blocks[b].payload_bytes;
  if (out.swa_ready) out.bytes += match.swa->entry.payload_bytes;
  events.Finish(out.blocks_ready, out.swa_ready);
}

Status ClusterStore::CopyUnreportedGroups(std::span<const std::byte> scratch,
                                          std::span<std::byte> dest, size_t block,
                                          FetchEvents& events) {
  Result<PayloadHeader> header = ParsePayloadHeader(scratch);
  if (!header.ok()) return header.status();
  for (uint32_t g = 0; g < header->groups.size(); ++g) {
    if (events.HasGroup(block, g)) continue;
    const GroupExtent& e = header->groups[g];
    std::memcpy(dest.data() + e.offset, scratch.data() + e.offset, e.length);
    events.Group(block, g);
  }
  events.Block(block);
  return Status::Ok();
}

}  // namespace strata
