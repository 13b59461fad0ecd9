// Commit to a node: reserve (staged here or not), write the bytes over the
// data plane, publish.
#include "remote/remote_store_impl.h"
#include "util/mutex.h"

namespace strata {

Result<Reservation> RemoteStore::Reserve(const ModelId& model, std::span<const CommitBlock> blocks,
                                         Nanos write_lease_ttl) {
  return ReserveStaged(model, blocks, write_lease_ttl, /*stage=*/true);
}

Result<Reservation> RemoteStore::ReserveUnstaged(const ModelId& model,
                                                 std::span<const CommitBlock> blocks,
                                                 Nanos write_lease_ttl) {
  return ReserveStaged(model, blocks, write_lease_ttl, /*stage=*/false);
}

Result<Reservation> RemoteStore::ReserveStaged(const ModelId& model,
                                               std::span<const CommitBlock> blocks,
                                               Nanos write_lease_ttl, bool stage) {
  v1::ReserveResponse resp;
  STRATA_RETURN_IF_ERROR(ReserveRpc(model, blocks, write_lease_ttl, &resp));
  // The caller writes into local staging; Publish ships it to the node.
  Staged staged;
  Reservation out;
  out.write_lease = resp.write_lease_id();
  out.expiry = SteadyClock().Now() + Nanos{resp.ttl_ms()} * kNanosPerMilli;
  for (int i = 0; i < resp.blocks_size(); ++i) {
    const v1::ReservedBlock& b = resp.blocks(i);
    ReservedBlock rb;
    if (b.state() == v1::RESERVED) {
      staged.ops.push_back({out.write_lease, b.location(), {}});
      staged.blocks.push_back(static_cast<size_t>(i));
      staged.sizes.push_back(blocks[static_cast<size_t>(i)].payload_bytes);
      if (stage) {
        auto& buf = staged.buffers.emplace_back(blocks[static_cast<size_t>(i)].payload_bytes);
        rb.buffer = std::span<std::byte>(buf);
      }
    } else {
      rb.state = b.state() == v1::ALREADY_PRESENT ? ReserveState::kAlreadyPresent
                                                  : ReserveState::kInFlight;
    }
    out.blocks.push_back(rb);
  }
  if (out.write_lease != 0) {
    staged.expiry = out.expiry;
    staged.ttl = Nanos{resp.ttl_ms()} * kNanosPerMilli;
    MutexLock lock(staged_mu_);
    // Reservations neither published nor aborted for one more lease TTL
    // past their expiry (the node dropped them then): their buffers go.
    const Nanos now = SteadyClock().Now();
    std::erase_if(staged_, [&](const auto& kv) { return kv.second.expiry + kv.second.ttl <= now; });
    if (!staged_.emplace(out.write_lease, std::move(staged)).second) {
      // Never hand out a second reservation under a live one's id: its
      // buffers would be freed here while the caller writes into them.
      // (The node drops the new reservation at its expiry.)
      return Internal("the node granted write lease " + std::to_string(out.write_lease) + " twice");
    }
  }
  return out;
}

Result<PublishResult> RemoteStore::Publish(LeaseId write_lease,
                                           std::span<const uint64_t> checksums) {
  std::optional<Staged> staged = TakeStaged(write_lease);
  if (!staged.has_value()) return NotFound("no reservation " + std::to_string(write_lease));
  if (staged->buffers.size() != staged->ops.size()) {
    (void)Abort(write_lease);
    return InvalidArgument("reservation " + std::to_string(write_lease) +
                           " has no staging: publish it with PublishFrom");
  }
  for (size_t i = 0; i < staged->ops.size(); ++i) {
    staged->ops[i].src = std::span<const std::byte>(staged->buffers[i]);
  }
  return WriteAndPublish(write_lease, staged->ops, checksums);
}

Result<PublishResult> RemoteStore::PublishFrom(LeaseId write_lease,
                                               std::span<const std::span<const std::byte>> payloads,
                                               std::span<const uint64_t> checksums) {
  std::optional<Staged> staged = TakeStaged(write_lease);
  if (!staged.has_value()) return NotFound("no reservation " + std::to_string(write_lease));
  for (size_t i = 0; i < staged->ops.size(); ++i) {
    const size_t b = staged->blocks[i];
    if (b >= payloads.size() || payloads[b].size() != staged->sizes[i]) {
      (void)Abort(write_lease);
      return InvalidArgument("publish of reservation " + std::to_string(write_lease) + ": block " +
                             std::to_string(b) + " needs " + std::to_string(staged->sizes[i]) +
                             " payload bytes");
    }
    staged->ops[i].src = payloads[b];
  }
  return WriteAndPublish(write_lease, staged->ops, checksums);
}

Result<PublishResult> RemoteStore::Commit(const ModelId& model,
                                          std::span<const CommitPayload> payloads) {
  Result<std::vector<CommitBlock>> checked = CommitBlocksOf(payloads);
  if (!checked.ok()) return checked.status();
  const std::vector<CommitBlock>& blocks = *checked;
  v1::ReserveResponse resp;
  STRATA_RETURN_IF_ERROR(ReserveRpc(model, blocks, 0, &resp));
  if (resp.blocks_size() != static_cast<int>(payloads.size())) {
    return Internal("reserve answered for the wrong number of blocks");
  }
  if (resp.write_lease_id() == 0) {
    PublishResult nothing_to_do;
    nothing_to_do.blocks.assign(payloads.size(), Status::Ok());
    return nothing_to_do;
  }
  // Straight from the caller's bytes into the node's arena: no staging.
  std::vector<dataplane::DataPlaneClient::WriteOp> ops;
  std::vector<uint64_t> checksums(payloads.size(), 0);
  for (size_t i = 0; i < payloads.size(); ++i) {
    const v1::ReservedBlock& b = resp.blocks(static_cast<int>(i));
    if (b.state() != v1::RESERVED) continue;
    ops.push_back({resp.write_lease_id(), b.location(), payloads[i].bytes});
    checksums[i] = payloads[i].checksum;
  }
  return WriteAndPublish(resp.write_lease_id(), ops, checksums);
}

std::optional<RemoteStore::Staged> RemoteStore::TakeStaged(LeaseId write_lease) {
  MutexLock lock(staged_mu_);
  auto it = staged_.find(write_lease);
  if (it == staged_.end()) return std::nullopt;
  std::optional<Staged> staged = std::move(it->second);
  staged_.erase(it);
  return staged;
}

Status RemoteStore::ReserveRpc(const ModelId& model, std::span<const CommitBlock> blocks, Nanos ttl,
                               v1::ReserveResponse* resp) {
  if (blocks.empty() || blocks.size() > kMaxBlocksPerCall) {
    return InvalidArgument("reserve needs 1.." + std::to_string(kMaxBlocksPerCall) + " blocks");
  }
  const v1::ReserveRequest req = wire::EncodeReserveRequest(model, blocks, ttl);
  STRATA_RETURN_IF_ERROR(Call([&](grpc::ClientContext* c) { return stub_->Reserve(c, req, resp); },
                              /*idempotent=*/false));
  seen_instance_.store(resp->instance_id());
  if (resp->blocks_size() != static_cast<int>(blocks.size())) {
    if (resp->write_lease_id() != 0) (void)Abort(resp->write_lease_id());
    return Internal("reserve answered for the wrong number of blocks");
  }
  for (const v1::ReservedBlock& b : resp->blocks()) {
    if (b.state() != v1::RESERVED && b.state() != v1::ALREADY_PRESENT &&
        b.state() != v1::IN_FLIGHT) {
      if (resp->write_lease_id() != 0) (void)Abort(resp->write_lease_id());
      return Internal("reserve answered an unknown block state");
    }
    // Staging and publishing hang off the write lease: without one a
    // reserved block could be neither written nor published.
    if (b.state() == v1::RESERVED && resp->write_lease_id() == 0) {
      return Internal("reserve answered a block reserved under no write lease");
    }
  }
  return Status::Ok();
}

Result<PublishResult> RemoteStore::WriteAndPublish(
    LeaseId lease, std::span<const dataplane::DataPlaneClient::WriteOp> ops,
    std::span<const uint64_t> checksums) {
  Status written;
  const Nanos deadline = Deadline();
  if (DataPlaneTurn turn(*this, deadline); !turn.held()) {
    written = DataPlaneBusy();
  } else {
    Result<dataplane::DataPlaneClient*> dp = DataPlaneLocked();
    written = dp.ok() ? (*dp)->Write(ops, deadline) : dp.status();
    if (!written.ok()) MaybeDropLocked(written);
  }
  if (!written.ok()) {
    (void)Abort(lease);
    return written;
  }
  v1::PublishRequest req;
  req.set_write_lease_id(lease);
  for (uint64_t c : checksums) req.add_checksums(c);
  v1::PublishResponse resp;
  Status st = Call([&](grpc::ClientContext* c) { return stub_->Publish(c, req, &resp); },
                   /*idempotent=*/false);
  if (!st.ok()) {
    (void)Abort(lease);
    return st;
  }
  return wire::DecodePublishResponse(resp);
}

}  // namespace strata
