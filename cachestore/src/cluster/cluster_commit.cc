// Commit across the cluster: each block reserved and published on its R
// write replicas.
#include "cluster/cluster_store_impl.h"
#include "util/mutex.h"

namespace strata {
namespace {

Status CheckReserveBlocks(std::span<const CommitBlock> blocks) {
  if (blocks.empty() || blocks.size() > kMaxBlocksPerCall) {
    return InvalidArgument("reserve needs 1.." + std::to_string(kMaxBlocksPerCall) + " blocks");
  }
  // Checked here too: a block every replica refuses still gets a staging
  // buffer of its size (so Publish can report it), and the nodes check
  // only the blocks placed on them.
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b].payload_bytes == 0 || blocks[b].payload_bytes > kMaxPayloadBytes) {
      return InvalidArgument("block " + std::to_string(b) + ": payload of " +
                             std::to_string(blocks[b].payload_bytes) + " bytes; must be 1.." +
                             std::to_string(kMaxPayloadBytes));
    }
  }
  return Status::Ok();
}

// What the replicas said of each block (those that had it already are
// counted in WriteLease::present), and whether any node answered at all.
struct ReplicaStates {
  explicit ReplicaStates(size_t n) : reserved(n, false), in_flight(n, false) {}
  std::vector<bool> reserved;
  std::vector<bool> in_flight;
  Status first_error;
  bool any_answer = false;
};

// Each node's reservation goes into its part; a node that failed fails
// its blocks (unless they failed already).
ReplicaStates TakeReservations(std::vector<Result<Reservation>>& results,
                               std::vector<WritePart>& parts, WriteLease& lease) {
  ReplicaStates states(lease.present.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    if (!results[p].ok()) {
      if (states.first_error.ok()) states.first_error = results[p].status();
      for (size_t b : parts[p].positions) {
        if (lease.failed[b].ok()) lease.failed[b] = results[p].status();
      }
      continue;
    }
    states.any_answer = true;
    parts[p].reservation = std::move(results[p]).value();
    const Reservation& r = parts[p].reservation;
    if (r.write_lease != 0) lease.expiry = std::min(lease.expiry, r.expiry);
    for (size_t j = 0; j < r.blocks.size() && j < parts[p].positions.size(); ++j) {
      const size_t b = parts[p].positions[j];
      switch (r.blocks[j].state) {
        case ReserveState::kReserved:
          states.reserved[b] = true;
          break;
        case ReserveState::kAlreadyPresent:
          ++lease.present[b];
          break;
        case ReserveState::kInFlight:
          states.in_flight[b] = true;
          break;
      }
    }
  }
  return states;
}

// The caller's answer: a staging buffer for each block it must write, or
// why it need not. Returns whether any block needs bytes.
bool StageBlocks(std::span<const CommitBlock> blocks, const ReplicaStates& states,
                 WriteLease& lease, Reservation& out) {
  out.blocks.resize(blocks.size());
  bool needs_bytes = false;
  lease.staging.resize(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    ReservedBlock& rb = out.blocks[b];
    // A block no replica took is still written by the caller, so that
    // Publish can report why it failed, block by block.
    const bool all_failed = !states.reserved[b] && lease.present[b] == 0 && !states.in_flight[b] &&
                            !lease.failed[b].ok();
    if (states.reserved[b] || all_failed) {
      lease.staging[b].resize(blocks[b].payload_bytes);
      rb.buffer = std::span<std::byte>(lease.staging[b]);
      needs_bytes = true;
    } else {
      rb.state = lease.present[b] > 0 ? ReserveState::kAlreadyPresent : ReserveState::kInFlight;
    }
  }
  return needs_bytes;
}

}  // namespace

Result<Reservation> ClusterStore::Reserve(const ModelId& model, std::span<const CommitBlock> blocks,
                                          Nanos write_lease_ttl) {
  STRATA_RETURN_IF_ERROR(CheckReserveBlocks(blocks));
  const std::shared_ptr<const View> view = Snapshot();
  std::vector<WritePart> parts;
  std::vector<std::vector<CommitBlock>> node_blocks;
  std::vector<Status> no_replica(blocks.size());
  std::vector<std::shared_ptr<NodeConn>> displaced;
  PlanWrites(*view, blocks, &parts, &node_blocks, &no_replica, &displaced);
  std::vector<Result<Reservation>> results =
      ReserveOnNodes(model, write_lease_ttl, parts, node_blocks, displaced);

  auto lease = std::make_shared<WriteLease>();
  lease->present.assign(blocks.size(), 0);
  lease->failed = no_replica;
  lease->expiry = std::numeric_limits<Nanos>::max();
  const ReplicaStates states = TakeReservations(results, parts, *lease);
  if (!states.any_answer) {
    return states.first_error.ok() ? Unavailable("no writable node") : states.first_error;
  }

  Reservation out;
  const bool needs_bytes = StageBlocks(blocks, states, *lease, out);
  lease->parts = std::move(parts);
  if (needs_bytes) KeepWriteLease(std::move(lease), out);
  return out;
}

std::vector<Result<Reservation>> ClusterStore::ReserveOnNodes(
    const ModelId& model, Nanos write_lease_ttl, const std::vector<WritePart>& parts,
    const std::vector<std::vector<CommitBlock>>& node_blocks,
    const std::vector<std::shared_ptr<NodeConn>>& displaced) {
  std::vector<Result<Reservation>> results(parts.size(), Unavailable("not asked"));
  std::vector<std::function<void()>> tasks;
  for (size_t p = 0; p < parts.size(); ++p) {
    tasks.emplace_back([&, p] {
      results[p] = OnNode(*parts[p].node, kWrites, [&](NodeClient& client) {
        return client.ReserveUnstaged(model, node_blocks[p], write_lease_ttl);
      });
    });
  }
  AddProbes(displaced, &tasks);
  pool_.RunAll(std::move(tasks));
  return results;
}

void ClusterStore::KeepWriteLease(std::shared_ptr<WriteLease> lease, Reservation& out) {
  const Nanos now = SteadyClock().Now();
  out.write_lease = next_lease_.fetch_add(1);
  out.expiry =
      lease->expiry == std::numeric_limits<Nanos>::max() ? now + call_timeout_ : lease->expiry;
  lease->reclaim_at = out.expiry + std::max<Nanos>(out.expiry - now, 0);
  // Reservations neither published nor aborted: the nodes dropped them.
  // Their staging is freed after the lock, not under it.
  std::vector<std::shared_ptr<WriteLease>> dropped;
  MutexLock lock(leases_mu_);
  std::erase_if(write_leases_, [&](auto& kv) {
    if (kv.second->reclaim_at > now) return false;
    dropped.push_back(std::move(kv.second));
    return true;
  });
  write_leases_.emplace(out.write_lease, std::move(lease));
}

Result<PublishResult> ClusterStore::Publish(LeaseId write_lease,
                                            std::span<const uint64_t> checksums) {
  std::shared_ptr<WriteLease> lease;
  {
    MutexLock lock(leases_mu_);
    auto it = write_leases_.find(write_lease);
    if (it != write_leases_.end()) {
      lease = std::move(it->second);
      write_leases_.erase(it);
    }
  }
  if (lease == nullptr) return NotFound("no reservation " + std::to_string(write_lease));
  const size_t n = lease->staging.size();
  if (checksums.size() != n) {
    AbortParts(*lease);
    return InvalidArgument("publish needs one checksum per reserved block: got " +
                           std::to_string(checksums.size()) + ", reservation has " +
                           std::to_string(n));
  }
  WriteTally tally(n);
  for (size_t b = 0; b < n; ++b) {
    for (uint32_t k = 0; k < lease->present[b]; ++k) tally.Ok(b);
    if (!lease->failed[b].ok()) tally.Fail(b, lease->failed[b]);
  }
  std::vector<Result<PublishResult>> results(lease->parts.size(), Unavailable("not asked"));
  std::vector<std::function<void()>> tasks;
  for (size_t p = 0; p < lease->parts.size(); ++p) {
    if (lease->parts[p].reservation.write_lease == 0) continue;  // nothing to write there
    tasks.emplace_back([&, p] {
      WritePart& part = lease->parts[p];
      std::vector<uint64_t> node_checksums;
      std::vector<std::span<const std::byte>> payloads;
      for (const size_t b : part.positions) {
        node_checksums.push_back(checksums[b]);
        payloads.emplace_back(lease->staging[b]);
      }
      bool asked = false;
      results[p] = OnNode(*part.node, kWrites, [&](NodeClient& client) {
        asked = true;
        return client.PublishFrom(part.reservation.write_lease, payloads, node_checksums);
      });
      // A node skipped since its reservation gets no publish: its
      // reservation ends now rather than hold the space to its expiry
      // (the cluster lease is gone, so no one could abort it later).
      if (!asked) ReleaseParts({{part.node, part.reservation.write_lease}});
    });
  }
  pool_.RunAll(std::move(tasks));
  for (size_t p = 0; p < lease->parts.size(); ++p) {
    const WritePart& part = lease->parts[p];
    if (part.reservation.write_lease == 0) continue;
    Tally(part.positions, part.reservation, results[p], &tally);
  }
  return tally.Result();
}

Result<PublishResult> ClusterStore::Commit(const ModelId& model,
                                           std::span<const CommitPayload> payloads) {
  if (payloads.empty() || payloads.size() > kMaxBlocksPerCall) {
    return InvalidArgument("commit needs 1.." + std::to_string(kMaxBlocksPerCall) + " blocks");
  }
  Result<std::vector<CommitBlock>> checked = CommitBlocksOf(payloads);
  if (!checked.ok()) return checked.status();
  const std::vector<CommitBlock>& blocks = *checked;
  const std::shared_ptr<const View> view = Snapshot();
  std::vector<WritePart> parts;
  std::vector<std::vector<CommitBlock>> node_blocks;
  std::vector<Status> no_replica(blocks.size());
  std::vector<std::shared_ptr<NodeConn>> displaced;
  PlanWrites(*view, blocks, &parts, &node_blocks, &no_replica, &displaced);

  std::vector<Result<PublishResult>> results(parts.size(), Unavailable("not asked"));
  std::vector<std::function<void()>> tasks;
  for (size_t p = 0; p < parts.size(); ++p) {
    tasks.emplace_back([&, p] {
      std::vector<CommitPayload> node_payloads;
      for (size_t j = 0; j < parts[p].positions.size(); ++j) {
        CommitPayload c = payloads[parts[p].positions[j]];
        c.block = node_blocks[p][j];
        node_payloads.push_back(c);
      }
      results[p] = OnNode(*parts[p].node, kWrites,
                          [&](NodeClient& client) { return client.Commit(model, node_payloads); });
    });
  }
  AddProbes(displaced, &tasks);
  pool_.RunAll(std::move(tasks));

  WriteTally tally(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (!no_replica[b].ok()) tally.Fail(b, no_replica[b]);
  }
  bool any_answer = false;
  Status first_error;
  for (size_t p = 0; p < parts.size(); ++p) {
    if (results[p].ok()) {
      any_answer = true;
    } else if (first_error.ok()) {
      first_error = results[p].status();
    }
    Tally(parts[p].positions, std::nullopt, results[p], &tally);
  }
  if (!any_answer) return first_error.ok() ? Unavailable("no writable node") : first_error;
  return tally.Result();
}

void ClusterStore::PlanWrites(const View& view, std::span<const CommitBlock> blocks,
                              std::vector<WritePart>* parts,
                              std::vector<std::vector<CommitBlock>>* node_blocks,
                              std::vector<Status>* no_replica,
                              std::vector<std::shared_ptr<NodeConn>>* displaced) const {
  std::vector<int> part_of(view.conns.size(), -1);
  const std::vector<bool> down = Down(view);
  const bool any_down = std::find(down.begin(), down.end(), true) != down.end();
  std::vector<bool> was_displaced(view.conns.size(), false);
  // Per node, the keys placed there so far in this batch.
  std::vector<std::vector<ChainKey>> placed(view.conns.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    std::vector<size_t> replicas =
        view.placement.WriteReplicas(blocks[b].key, view.replication, down);
    if (any_down) {
      for (size_t n : view.placement.ReadReplicas(blocks[b].key, view.replication, down)) {
        if (down[n] && !was_displaced[n]) {
          was_displaced[n] = true;
          displaced->push_back(view.conns[n]);
        }
      }
    }
    // With every writable node down, the block goes where it belongs:
    // refused there at once, saying why.
    if (replicas.empty()) {
      replicas = view.placement.WriteReplicas(blocks[b].key, view.replication);
    }
    if (replicas.empty()) {
      (*no_replica)[b] = Unavailable("no node takes writes (all draining or gone)");
      continue;
    }
    for (size_t node : replicas) {
      if (part_of[node] < 0) {
        part_of[node] = static_cast<int>(parts->size());
        parts->push_back(WritePart{view.conns[node], {}, {}});
        node_blocks->emplace_back();
      }
      const auto p = static_cast<size_t>(part_of[node]);
      CommitBlock cb = blocks[b];
      if (cb.parent.has_value() &&
          std::find(placed[node].begin(), placed[node].end(), *cb.parent) == placed[node].end()) {
        cb.parent.reset();
      }
      if (cb.kind == StateKind::kGlobalKv) placed[node].push_back(cb.key);
      (*parts)[p].positions.push_back(b);
      (*node_blocks)[p].push_back(cb);
    }
  }
}

void ClusterStore::Tally(const std::vector<size_t>& positions, const std::optional<Reservation>& r,
                         const Result<PublishResult>& result, WriteTally* tally) {
  for (size_t j = 0; j < positions.size(); ++j) {
    const size_t b = positions[j];
    if (!result.ok()) {
      tally->Fail(b, result.status());
    } else if (j < result->blocks.size() && result->blocks[j].ok()) {
      // Publish answers for every block of the reservation: OK for blocks
      // it had already (counted at reserve time).
      if (!r.has_value() || r->blocks[j].state == ReserveState::kReserved) tally->Ok(b);
    } else if (j < result->blocks.size()) {
      tally->Fail(b, result->blocks[j]);
    } else if (!r.has_value()) {
      tally->Ok(b);  // a commit with nothing to write answers with no blocks
    }
  }
}

}  // namespace strata
