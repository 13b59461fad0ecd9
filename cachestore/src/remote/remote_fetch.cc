// Fetch from a node: over the data plane into the caller's buffers (or
// copied out of a mapped arena), verified here before anyone is told.
#include "remote/remote_store_impl.h"

namespace strata {

FetchOutcome RemoteStore::FetchNow(const FetchRequest& req) {
  FetchOutcome out;
  bool want_swa = false;
  out.status = CheckFetchRequest(req, &want_swa);
  if (!out.status.ok()) return out;
  const MatchResult& match = *req.match;
  const size_t n = req.block_buffers.size();
  if (n == 0 && !want_swa) return out;
  const Nanos deadline = Deadline();  // the transfer's, from the call's start

  // Locations are only good under a lease: take one if the match did not.
  const MatchResult* leased = &match;
  std::optional<MatchResult> own;
  if (match.lease == 0) {
    Result<MatchResult> r = MatchAgainWithLease(*this, match, n, want_swa);
    if (!r.ok()) {
      out.status = r.status();
      return out;
    }
    own = std::move(r).value();
    leased = &*own;
  }
  bool mapped = false;
  Status connected;
  if (DataPlaneTurn turn(*this, deadline); !turn.held()) {
    connected = DataPlaneBusy();
  } else {
    Result<dataplane::DataPlaneClient*> dp = DataPlaneLocked();
    connected = dp.status();
    if (dp.ok() && (*dp)->MappedRegion() != nullptr) {
      mapped = true;
      FetchMapped((*dp)->MappedRegion(), match, *leased, req, n, want_swa, out);
    }
  }
  // No data plane: failed once, not asked for again (each try says Hello).
  if (!connected.ok()) {
    out.status = connected;
  } else if (!mapped) {
    FetchInto(req, match, *leased, n, want_swa, deadline, out);
  }
  if (own.has_value() && own->lease != 0) (void)Abort(own->lease);
  return out;
}

size_t RemoteStore::LeasedPrefix(const MatchResult& match, const MatchResult& leased, size_t n) {
  size_t i = 0;
  while (i < n && i < leased.blocks.size() && leased.blocks[i].tier == Tier::kDram &&
         leased.blocks[i].key == match.blocks[i].key &&
         leased.blocks[i].checksum == match.blocks[i].checksum &&
         leased.blocks[i].payload_bytes == match.blocks[i].payload_bytes) {
    ++i;
  }
  return i;
}

bool RemoteStore::SwaLeased(const MatchResult& match, const MatchResult& leased) {
  return leased.swa.has_value() && leased.swa->entry.tier == Tier::kDram &&
         leased.swa->entry.key == match.swa->entry.key &&
         leased.swa->entry.checksum == match.swa->entry.checksum &&
         leased.swa->entry.payload_bytes == match.swa->entry.payload_bytes;
}

void RemoteStore::FetchMapped(const std::byte* base, const MatchResult& match,
                              const MatchResult& leased, const FetchRequest& req, size_t n,
                              bool want_swa, FetchOutcome& out) {
  if (LeaseEnded(leased.lease)) {
    out.status =
        Status(StatusCode::kLeaseExpired, "lease " + std::to_string(leased.lease) + " has expired");
    return;
  }
  auto source = [&](const BlockMatch& b) -> const std::byte* {
    if (b.location > region_bytes_ || b.payload_bytes > region_bytes_ - b.location) return nullptr;
    return base + b.location;
  };
  FetchPrefix prefix(n, want_swa ? std::optional(match.swa->boundary_blocks) : std::nullopt);
  prefix.CutMissing(LeasedPrefix(match, leased, n));
  // Headers: each must hash to its entry checksum.
  std::vector<PayloadHeader> headers(prefix.usable());
  for (size_t b = 0; b < headers.size(); ++b) {
    const BlockMatch& bm = leased.blocks[b];
    const std::byte* src = source(bm);
    std::byte* dst = req.block_buffers[b].data();
    if (src == nullptr || bm.payload_bytes < 32) {
      prefix.CutBlock(b, Internal("location outside the node's arena"));
      break;
    }
    uint32_t hb = 0;
    std::memcpy(&hb, src + 20, sizeof(hb));  // header bytes H, see layout.h
    if (hb > bm.payload_bytes || CopyAndChecksum(dst, src, hb) != bm.checksum) {
      prefix.CutBlock(b, ChecksumMismatch("header fails the entry checksum"));
      break;
    }
    Result<PayloadHeader> h = ParsePayloadHeader({dst, bm.payload_bytes});
    if (!h.ok() || h->header_bytes != hb) {
      prefix.CutBlock(b, ChecksumMismatch("malformed header"));
      break;
    }
    headers[b] = std::move(h).value();
    out.bytes += hb;
  }
  // The SWA state before the bodies (see VerifySwa), when the prefix it
  // belongs to still stands.
  const bool swa_ok = want_swa && SwaLeased(match, leased);
  bool swa_verified = false;
  if (swa_ok && prefix.SwaCovered()) {
    const BlockMatch& e = leased.swa->entry;
    PayloadCheck swa{req.swa_buffer.first(e.payload_bytes), e.checksum, {}, {}};
    if (const std::byte* src = source(e); src != nullptr) {
      std::memcpy(swa.bytes.data(), src, e.payload_bytes);
      swa_verified = VerifySwa(req, swa, prefix);
    } else {
      prefix.Report(Internal("the SWA state's location lies outside the node's arena"));
    }
  }
  std::vector<VerifiedCopy> copies(prefix.usable());
  for (size_t b = 0; b < copies.size(); ++b) {
    copies[b] = {source(leased.blocks[b]), req.block_buffers[b].data(), &headers[b]};
  }
  std::optional<CopyFailure> failure;
  const size_t arrived =
      CopyVerifiedBodies(copies, req.on_event, &out.bytes, &failure, nullptr, &copy_pool_);
  if (failure.has_value()) {
    prefix.CutBlock(arrived, ChecksumMismatch("layer group " + std::to_string(failure->group) +
                                              " fails its checksum"));
  }
  FinishSwa(leased, want_swa, swa_ok, swa_verified, prefix, out);
}

bool RemoteStore::VerifySwa(const FetchRequest& req, PayloadCheck& p, FetchPrefix& prefix) {
  Status st = VerifyHeader(p);
  for (size_t g = 0; st.ok() && g < p.header->groups.size(); ++g) st = VerifyGroup(p, g);
  if (!st.ok()) {
    prefix.Report(Status(st.code(), "SWA state: " + st.message()));
    return false;
  }
  if (req.on_event) req.on_event({FetchEvent::Type::kSwaReady, 0, 0});
  return true;
}

void RemoteStore::FinishSwa(const MatchResult& leased, bool want_swa, bool swa_ok,
                            bool swa_verified, FetchPrefix& prefix, FetchOutcome& out) {
  if (want_swa && !swa_ok) prefix.SwaMissing();
  prefix.Finish(swa_verified, out);
  if (out.swa_ready) out.bytes += leased.swa->entry.payload_bytes;
}

// One FetchInto: the pieces planned before any byte arrives, what has
// landed and verified of them as they land, and the prefix they make.
struct RemoteStore::FetchIntoState {
  using ReadOp = dataplane::DataPlaneClient::ReadOp;
  using Range = dataplane::DataPlaneClient::Range;
  // An op reads piece `group` of payloads members[first, first + count).
  struct Piece {
    size_t first;
    size_t count;
    int group;  // -1: the whole payload (header and all groups)
  };

  FetchIntoState(const FetchRequest& request, const MatchResult& match,
                 const MatchResult& leased_match, size_t n, bool swa_wanted);
  FetchIntoState(const FetchIntoState&) = delete;
  FetchIntoState& operator=(const FetchIntoState&) = delete;

  // Planning the pieces.
  void PlanGroups();
  void PlanPieces();
  void PlanOps();
  // Verification as pieces land.
  void OnDone(size_t i, const Status& st);
  void VerifyBlock(size_t b);
  void Announce();
  // Finishing, once the transfer is over.
  void Finish(const Status& transfer, FetchOutcome& out);

  const FetchRequest& req;
  const MatchResult& leased;
  const bool want_swa;
  const size_t covered;  // blocks the lease really covers
  FetchPrefix prefix;
  const bool swa_ok;
  std::vector<PayloadCheck> checks;  // the covered blocks, then the SWA state
  // Per covered block, its pieces: (offset, length) in the payload.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> plan;
  size_t max_groups = 0;
  std::vector<Range> ranges;
  std::vector<Piece> pieces;
  std::vector<size_t> members;  // payload indexes, grouped by piece
  std::vector<ReadOp> ops;
  std::vector<std::vector<bool>> landed;
  std::vector<std::vector<bool>> verified;
  size_t groups_done = 0;  // layer groups announced for the whole prefix
  bool swa_verified = false;
};

void RemoteStore::FetchInto(const FetchRequest& req, const MatchResult& match,
                            const MatchResult& leased, size_t n, bool want_swa, Nanos deadline,
                            FetchOutcome& out) {
  FetchIntoState state(req, match, leased, n, want_swa);
  state.PlanGroups();
  state.PlanPieces();
  state.PlanOps();
  const Status transfer = ReadPieces(state, deadline);
  state.Finish(transfer, out);
}

RemoteStore::FetchIntoState::FetchIntoState(const FetchRequest& request, const MatchResult& match,
                                            const MatchResult& leased_match, size_t n,
                                            bool swa_wanted)
    : req(request),
      leased(leased_match),
      want_swa(swa_wanted),
      // Blocks the lease really covers, in order and with the same identity.
      covered(LeasedPrefix(match, leased, n)),
      prefix(n, want_swa ? std::optional(match.swa->boundary_blocks) : std::nullopt),
      swa_ok(want_swa && SwaLeased(match, leased)),
      checks(covered + (swa_ok ? 1 : 0)) {
  prefix.CutMissing(covered);
  for (size_t b = 0; b < covered; ++b) {
    const BlockMatch& bm = leased.blocks[b];
    checks[b] = {req.block_buffers[b].first(bm.payload_bytes), bm.checksum, {}, {}};
  }
}

// The header and group table of a built-in layout sit at fixed places, so
// pieces can be planned before any byte arrives: layer group g of every
// block is requested before group g + 1 of any.
void RemoteStore::FetchIntoState::PlanGroups() {
  plan.resize(covered);
  for (size_t b = 0; b < covered; ++b) {
    const BlockMatch& bm = leased.blocks[b];
    static const Layout kGlobalKv = MakeGlobalKvLayout(kV41GlobalKvLayoutId);
    const Layout& layout = kGlobalKv;
    if (bm.layout_id == layout.id && layout.PayloadBytes() == bm.payload_bytes) {
      uint64_t at = layout.HeaderBytes();
      for (size_t g = 0; g < layout.groups.size(); ++g) {
        // Group 0 carries the header with it.
        const uint64_t start = g == 0 ? 0 : at;
        plan[b].push_back({start, at + layout.groups[g].bytes - start});
        at += layout.groups[g].bytes;
      }
    } else {
      plan[b].push_back({0, bm.payload_bytes});
    }
    max_groups = std::max(max_groups, plan[b].size());
  }
  // Nothing landed or verified yet: one flag per planned piece.
  landed.resize(covered);
  verified.resize(covered);
  for (size_t b = 0; b < covered; ++b) {
    landed[b].assign(plan[b].size(), false);
    verified[b].assign(plan[b].size(), false);
  }
}

// The same piece of several blocks travels as one op (one request and one
// reply over TCP, where a message per ~76 KB piece costs a third of the
// bandwidth).
void RemoteStore::FetchIntoState::PlanPieces() {
  for (size_t g = 0; g < max_groups; ++g) {
    Piece piece{members.size(), 0, 0};
    for (size_t b = 0; b <= covered; ++b) {
      const bool more = b < covered && g < plan[b].size();
      const int kind = more && plan[b].size() > 1 ? static_cast<int>(g) : -1;
      if (piece.count > 0 && (!more || kind != piece.group ||
                              piece.count == dataplane::DataPlaneClient::kMaxRangesPerRead)) {
        pieces.push_back(piece);
        piece = {members.size(), 0, 0};
      }
      if (!more) continue;
      const auto [off, len] = plan[b][g];
      ranges.push_back({leased.blocks[b].location + off, checks[b].bytes.subspan(off, len)});
      members.push_back(b);
      piece.group = kind;
      ++piece.count;
    }
  }
}

// One op per piece; the SWA state goes first (see VerifySwa).
void RemoteStore::FetchIntoState::PlanOps() {
  if (swa_ok) {
    const BlockMatch& e = leased.swa->entry;
    checks[covered] = {req.swa_buffer.first(e.payload_bytes), e.checksum, {}, {}};
    ops.push_back({leased.lease, e.location, checks[covered].bytes});
    members.push_back(covered);
    pieces.insert(pieces.begin(), Piece{members.size() - 1, 1, -1});
  }
  for (size_t i = swa_ok ? 1 : 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    const Range& head = ranges[piece.first];
    ops.push_back({leased.lease, head.offset, head.dest,
                   std::span<const Range>(ranges).subspan(piece.first + 1, piece.count - 1)});
  }
}

Status RemoteStore::ReadPieces(FetchIntoState& state, Nanos deadline) {
  Status transfer;
  if (DataPlaneTurn turn(*this, deadline); !turn.held()) {
    transfer = DataPlaneBusy();
  } else {
    Result<dataplane::DataPlaneClient*> dp = DataPlaneLocked();
    if (dp.ok() && (*dp)->mode() == dataplane::Mode::kRma && LeaseEnded(state.leased.lease)) {
      dp = Status(StatusCode::kLeaseExpired,
                  "lease " + std::to_string(state.leased.lease) + " has expired");
      state.prefix.Truncate(0);  // reported by Finish, as the transfer's failure
    }
    auto on_done = [&state](size_t i, const Status& st) { state.OnDone(i, st); };
    transfer = dp.ok() ? (*dp)->Read(state.ops, on_done, deadline) : dp.status();
    if (!transfer.ok()) MaybeDropLocked(transfer);
  }
  return transfer;
}

// Piece i landed (or failed): verifies what it completes.
void RemoteStore::FetchIntoState::OnDone(size_t i, const Status& st) {
  const Piece& piece = pieces[i];
  const std::span<const size_t> payloads(members.data() + piece.first, piece.count);
  if (payloads[0] == covered && swa_ok) {
    if (!st.ok()) {
      prefix.Report(st);
    } else if (prefix.SwaCovered()) {
      swa_verified = VerifySwa(req, checks[covered], prefix);
    }
    return;
  }
  if (!st.ok()) {
    prefix.Cut(payloads[0], st);
    return;
  }
  for (size_t b : payloads) {
    landed[b][piece.group < 0 ? 0 : static_cast<size_t>(piece.group)] = true;
    VerifyBlock(b);
  }
  Announce();
}

// Verifies whatever of block b has landed. The header rides in piece 0; a
// group that lands before its block's header waits for it.
void RemoteStore::FetchIntoState::VerifyBlock(size_t b) {
  PayloadCheck& p = checks[b];
  if (b >= prefix.usable() || !landed[b][0]) return;
  if (!p.header.has_value()) {
    if (Status st = VerifyHeader(p); !st.ok()) return prefix.CutBlock(b, st);
    if (plan[b].size() > 1 && p.header->groups.size() != plan[b].size()) {
      return prefix.CutBlock(b, ChecksumMismatch("unexpected group table"));
    }
  }
  for (size_t g = 0; g < plan[b].size(); ++g) {
    if (!landed[b][g] || verified[b][g]) continue;
    // A whole-payload piece covers every group of the header's table.
    const size_t first = plan[b].size() == 1 ? 0 : g;
    const size_t last = plan[b].size() == 1 ? p.header->groups.size() : g + 1;
    for (size_t gg = first; gg < last; ++gg) {
      if (Status st = VerifyGroup(p, gg); !st.ok()) return prefix.CutBlock(b, st);
      if (req.on_event) {
        req.on_event(
            {FetchEvent::Type::kGroupReady, static_cast<uint32_t>(b), static_cast<uint32_t>(gg)});
      }
    }
    verified[b][g] = true;
  }
}

// Announces each layer group once every block of the prefix has it.
void RemoteStore::FetchIntoState::Announce() {
  while (req.on_event && prefix.usable() > 0 && groups_done < max_groups) {
    for (size_t b = 0; b < prefix.usable(); ++b) {
      if (groups_done < verified[b].size() && !verified[b][groups_done]) return;
    }
    req.on_event({FetchEvent::Type::kLayerGroupDone, static_cast<uint32_t>(prefix.usable()),
                  static_cast<uint32_t>(groups_done)});
    ++groups_done;
  }
}

// The prefix ends at the first block not verified whole; what stands is
// reported ready and counted.
void RemoteStore::FetchIntoState::Finish(const Status& transfer, FetchOutcome& out) {
  if (!transfer.ok()) prefix.Report(transfer);
  if (!transfer.ok() && prefix.usable() == covered) {
    // No piece reported the failure (e.g. no endpoint at all).
    for (size_t b = 0; b < covered; ++b) {
      if (!std::all_of(verified[b].begin(), verified[b].end(), [](bool v) { return v; })) {
        prefix.Truncate(b);
        break;
      }
    }
  }
  for (size_t b = 0; b < prefix.usable(); ++b) {
    if (!std::all_of(verified[b].begin(), verified[b].end(), [](bool v) { return v; })) {
      prefix.Cut(b, Internal("block " + std::to_string(b) + " did not complete"));
      break;
    }
  }
  Announce();
  for (size_t b = 0; b < prefix.usable(); ++b) {
    out.bytes += checks[b].bytes.size();
    if (req.on_event) req.on_event({FetchEvent::Type::kBlockReady, static_cast<uint32_t>(b), 0});
  }
  FinishSwa(leased, want_swa, swa_ok, swa_verified, prefix, out);
}

}  // namespace strata
