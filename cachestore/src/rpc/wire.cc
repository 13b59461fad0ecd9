#include "rpc/wire.h"

#include <cstring>
#include <string>
#include <string_view>

#include <google/protobuf/unknown_field_set.h>

namespace strata::wire {
namespace {

template <typename D>
std::string Bytes(const D& d) {
  return std::string(reinterpret_cast<const char*>(d.bytes.data()), d.bytes.size());
}

template <typename D>
Status Digest(const std::string& s, std::string_view what, D* out) {
  if (s.size() != out->bytes.size()) {
    return InvalidArgument(std::string(what) + " must be 16 bytes, got " +
                           std::to_string(s.size()));
  }
  std::memcpy(out->bytes.data(), s.data(), s.size());
  return Status::Ok();
}

constexpr int64_t kNanosPerMs = 1'000'000;

Status Ttl(uint32_t ms, Nanos* out) {
  *out = int64_t{ms} * kNanosPerMs;
  if (*out > kMaxLeaseTtl)
    return InvalidArgument("lease ttl above " + std::to_string(kMaxLeaseTtl / kNanosPerMs) + " ms");
  return Status::Ok();
}

v1::Tier EncodeTier(Tier t) {
  switch (t) {
    case Tier::kHbm:
      return v1::HBM;
    case Tier::kDram:
      return v1::DRAM;
    case Tier::kSsd:
      return v1::SSD;
  }
  return v1::TIER_UNSPECIFIED;
}

Result<Tier> DecodeTier(v1::Tier t) {
  switch (t) {
    case v1::HBM:
      return Tier::kHbm;
    case v1::DRAM:
      return Tier::kDram;
    case v1::SSD:
      return Tier::kSsd;
    default:
      return InvalidArgument("unknown tier");
  }
}

v1::BlockMatch EncodeBlock(const BlockMatch& b) {
  v1::BlockMatch out;
  out.set_key(Bytes(b.key));
  out.set_tier(EncodeTier(b.tier));
  out.set_layout_id(b.layout_id);
  out.set_payload_bytes(b.payload_bytes);
  out.set_checksum(b.checksum);
  out.set_location(b.location);
  return out;
}

Status DecodeBlock(const v1::BlockMatch& in, BlockMatch* out) {
  STRATA_RETURN_IF_ERROR(Digest(in.key(), "block key", &out->key));
  Result<Tier> tier = DecodeTier(in.tier());
  if (!tier.ok()) return tier.status();
  out->tier = *tier;
  out->layout_id = in.layout_id();
  out->payload_bytes = in.payload_bytes();
  out->checksum = in.checksum();
  out->location = in.location();
  if (out->payload_bytes > kMaxPayloadBytes) return InvalidArgument("payload size above the limit");
  return Status::Ok();
}

constexpr size_t kKeyBytes = sizeof(ChainKey::bytes);

std::string PackKeys(std::span<const ChainKey> keys) {
  std::string out(keys.size() * kKeyBytes, '\0');
  for (size_t i = 0; i < keys.size(); ++i) {
    std::memcpy(out.data() + i * kKeyBytes, keys[i].bytes.data(), kKeyBytes);
  }
  return out;
}

// 16-byte keys, concatenated; at most kMaxBlocksPerCall of them.
Status UnpackKeys(const std::string& packed, const char* what, std::vector<ChainKey>* out) {
  if (packed.size() % kKeyBytes != 0) {
    return InvalidArgument(std::string(what) + ": packed keys are " +
                           std::to_string(packed.size()) + " bytes, not a multiple of 16");
  }
  const size_t n = packed.size() / kKeyBytes;
  if (n > kMaxBlocksPerCall) {
    return InvalidArgument(std::string(what) + " of " + std::to_string(n) + " keys exceeds " +
                           std::to_string(kMaxBlocksPerCall));
  }
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy((*out)[i].bytes.data(), packed.data() + i * kKeyBytes, kKeyBytes);
  }
  return Status::Ok();
}

}  // namespace

v1::MatchRequest EncodeMatchRequest(const MatchKeysRequest& r) {
  v1::MatchRequest out;
  out.set_model_id(Bytes(r.model_id));
  out.set_root_key(Bytes(r.root));
  out.set_keys(PackKeys(r.keys));
  out.set_block_tokens(r.block_tokens);
  out.set_want_swa(r.want_swa);
  out.set_take_lease(r.take_lease);
  out.set_lease_ttl_ms(static_cast<uint32_t>(r.lease_ttl / kNanosPerMs));
  out.set_independent_keys(r.independent_keys);
  return out;
}

namespace {

// A field number this version reserved carries data: the peer speaks the
// protocol before the packed match format. Decoding on would read an
// empty key list and report a miss instead of the mismatch.
Status RejectRetiredField(const google::protobuf::Message& m, int number, const char* what) {
  const google::protobuf::UnknownFieldSet& unknown = m.GetReflection()->GetUnknownFields(m);
  for (int i = 0; i < unknown.field_count(); ++i) {
    if (unknown.field(i).number() == number) {
      return InvalidArgument(std::string(what) + " uses the retired unpacked format (field " +
                             std::to_string(number) +
                             "): client and node are from incompatible releases");
    }
  }
  return Status::Ok();
}

}  // namespace

Status DecodeMatchRequest(const v1::MatchRequest& in, DecodedMatch* out) {
  STRATA_RETURN_IF_ERROR(RejectRetiredField(in, 3, "match request"));
  MatchKeysRequest& r = out->request;
  STRATA_RETURN_IF_ERROR(Digest(in.model_id(), "model_id", &r.model_id));
  STRATA_RETURN_IF_ERROR(Digest(in.root_key(), "root_key", &r.root));
  STRATA_RETURN_IF_ERROR(UnpackKeys(in.keys(), "match", &out->keys));
  r.keys = out->keys;
  r.block_tokens = in.block_tokens();
  r.want_swa = in.want_swa();
  r.take_lease = in.take_lease();
  r.independent_keys = in.independent_keys();
  STRATA_RETURN_IF_ERROR(Ttl(in.lease_ttl_ms(), &r.lease_ttl));
  return CheckMatchOptions(r.block_tokens, r.lease_ttl, r.keys.size());
}

v1::MatchResponse EncodeMatchResult(const MatchResult& m) {
  v1::MatchResponse out;
  v1::BlockRun* run = out.mutable_blocks();
  const int n = static_cast<int>(m.blocks.size());
  std::string* keys = run->mutable_keys();
  keys->resize(m.blocks.size() * kKeyBytes);
  run->mutable_tiers()->Reserve(n);
  run->mutable_layout_ids()->Reserve(n);
  run->mutable_payload_bytes()->Reserve(n);
  run->mutable_checksums()->Reserve(n);
  run->mutable_locations()->Reserve(n);
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const BlockMatch& b = m.blocks[i];
    std::memcpy(keys->data() + i * kKeyBytes, b.key.bytes.data(), kKeyBytes);
    run->add_tiers(EncodeTier(b.tier));
    run->add_layout_ids(b.layout_id);
    run->add_payload_bytes(b.payload_bytes);
    run->add_checksums(b.checksum);
    run->add_locations(b.location);
  }
  out.set_prefix_key(Bytes(m.prefix_key));
  if (m.swa.has_value()) {
    out.mutable_swa()->set_boundary_blocks(m.swa->boundary_blocks);
    *out.mutable_swa()->mutable_entry() = EncodeBlock(m.swa->entry);
  }
  out.set_lease_id(m.lease);
  out.set_prompt_blocks(m.prompt_blocks);
  return out;
}

Result<MatchResult> DecodeMatchResponse(const v1::MatchResponse& in) {
  STRATA_RETURN_IF_ERROR(RejectRetiredField(in, 1, "match response"));
  MatchResult m;
  const v1::BlockRun& run = in.blocks();
  std::vector<ChainKey> keys;
  STRATA_RETURN_IF_ERROR(UnpackKeys(run.keys(), "match response", &keys));
  const int n = static_cast<int>(keys.size());
  if (run.tiers_size() != n || run.layout_ids_size() != n || run.payload_bytes_size() != n ||
      run.checksums_size() != n || run.locations_size() != n) {
    return InvalidArgument("match response: block arrays of different lengths");
  }
  m.blocks.resize(keys.size());
  for (int i = 0; i < n; ++i) {
    BlockMatch& b = m.blocks[static_cast<size_t>(i)];
    b.key = keys[static_cast<size_t>(i)];
    Result<Tier> tier = DecodeTier(run.tiers(i));
    if (!tier.ok()) return tier.status();
    b.tier = *tier;
    b.layout_id = run.layout_ids(i);
    b.payload_bytes = run.payload_bytes(i);
    b.checksum = run.checksums(i);
    b.location = run.locations(i);
    if (b.payload_bytes > kMaxPayloadBytes) return InvalidArgument("payload size above the limit");
  }
  STRATA_RETURN_IF_ERROR(Digest(in.prefix_key(), "prefix_key", &m.prefix_key));
  if (in.has_swa()) {
    SwaMatch swa;
    swa.boundary_blocks = in.swa().boundary_blocks();
    STRATA_RETURN_IF_ERROR(DecodeBlock(in.swa().entry(), &swa.entry));
    if (swa.boundary_blocks == 0 || swa.boundary_blocks > m.blocks.size()) {
      return InvalidArgument("SWA boundary outside the hit run");
    }
    m.swa = swa;
  }
  m.lease = in.lease_id();
  m.prompt_blocks = in.prompt_blocks();
  return m;
}

v1::ReserveRequest EncodeReserveRequest(const ModelId& model, std::span<const CommitBlock> blocks,
                                        Nanos write_lease_ttl) {
  v1::ReserveRequest out;
  out.set_model_id(Bytes(model));
  for (const CommitBlock& b : blocks) {
    v1::CommitBlock* o = out.add_blocks();
    o->set_key(Bytes(b.key));
    o->set_kind(EncodeKind(b.kind));
    o->set_layout_id(b.layout_id);
    o->set_payload_bytes(b.payload_bytes);
    if (b.parent.has_value()) o->set_parent_key(Bytes(*b.parent));
  }
  out.set_write_lease_ttl_ms(static_cast<uint32_t>(write_lease_ttl / kNanosPerMs));
  return out;
}

Status DecodeReserveRequest(const v1::ReserveRequest& in, ModelId* model,
                            std::vector<CommitBlock>* blocks, Nanos* write_lease_ttl) {
  if (in.blocks_size() == 0 || in.blocks_size() > static_cast<int>(kMaxBlocksPerCall)) {
    return InvalidArgument("reserve needs 1.." + std::to_string(kMaxBlocksPerCall) + " blocks");
  }
  STRATA_RETURN_IF_ERROR(Digest(in.model_id(), "model_id", model));
  blocks->assign(static_cast<size_t>(in.blocks_size()), {});
  for (int i = 0; i < in.blocks_size(); ++i) {
    const v1::CommitBlock& b = in.blocks(i);
    CommitBlock& o = (*blocks)[static_cast<size_t>(i)];
    const std::string block = "block " + std::to_string(i) + ": ";
    STRATA_RETURN_IF_ERROR(Digest(b.key(), block + "key", &o.key));
    if (b.kind() != v1::GLOBAL_KV && b.kind() != v1::SWA_STATE) {
      return InvalidArgument(block + "unknown state kind");
    }
    o.kind = b.kind() == v1::GLOBAL_KV ? StateKind::kGlobalKv : StateKind::kSwaState;
    o.layout_id = b.layout_id();
    o.payload_bytes = b.payload_bytes();
    if (!b.parent_key().empty()) {
      ChainKey parent;
      STRATA_RETURN_IF_ERROR(Digest(b.parent_key(), block + "parent_key", &parent));
      o.parent = parent;
    }
  }
  return Ttl(in.write_lease_ttl_ms(), write_lease_ttl);
}

// The wire codes are the StatusCode values; keep the two enums in step.
static_assert(static_cast<int>(StatusCode::kNotFound) == v1::NOT_FOUND);
static_assert(static_cast<int>(StatusCode::kLeaseExpired) == v1::LEASE_EXPIRED);
static_assert(static_cast<int>(StatusCode::kChecksumMismatch) == v1::CHECKSUM_MISMATCH);
static_assert(static_cast<int>(StatusCode::kResourceExhausted) == v1::RESOURCE_EXHAUSTED);
static_assert(static_cast<int>(StatusCode::kPermissionDenied) == v1::PERMISSION_DENIED);
static_assert(static_cast<int>(StatusCode::kUnauthenticated) == v1::UNAUTHENTICATED);
static_assert(static_cast<int>(StatusCode::kUnavailable) == v1::UNAVAILABLE);
static_assert(static_cast<int>(StatusCode::kDeadlineExceeded) == v1::DEADLINE_EXCEEDED);
static_assert(static_cast<int>(StatusCode::kInvalidArgument) == v1::INVALID_ARGUMENT);
static_assert(static_cast<int>(StatusCode::kAlreadyExists) == v1::ALREADY_EXISTS);
static_assert(static_cast<int>(StatusCode::kInternal) == v1::INTERNAL);

v1::Code EncodeCode(StatusCode code) { return static_cast<v1::Code>(code); }

StatusCode DecodeCode(v1::Code code) {
  if (code < v1::OK || code > v1::INTERNAL) return StatusCode::kInternal;
  return static_cast<StatusCode>(code);
}

v1::PublishResponse EncodePublishResult(const PublishResult& r) {
  v1::PublishResponse out;
  for (const Status& s : r.blocks) {
    v1::BlockStatus* b = out.add_blocks();
    b->set_code(EncodeCode(s.code()));
    b->set_message(s.message().substr(0, 4096));
  }
  out.set_published(r.published);
  return out;
}

PublishResult DecodePublishResponse(const v1::PublishResponse& in) {
  PublishResult r;
  for (const v1::BlockStatus& b : in.blocks()) {
    const StatusCode code = DecodeCode(b.code());
    r.blocks.push_back(code == StatusCode::kOk ? Status::Ok() : Status(code, b.message()));
  }
  r.published = in.published();
  return r;
}

v1::EntryInfo EncodeEntryInfo(const EntryInfo& e, Nanos now) {
  v1::EntryInfo out;
  out.set_key(Bytes(e.key));
  out.set_kind(EncodeKind(e.kind));
  out.set_model_id(Bytes(e.model_id));
  out.set_layout_id(e.layout_id);
  out.set_payload_bytes(e.payload_bytes);
  out.set_checksum(e.checksum);
  out.set_tier(EncodeTier(e.tier));
  out.set_age_ms((now - e.commit_time) / kNanosPerMs);
  out.set_expires_in_ms((e.expiry - now) / kNanosPerMs);
  out.set_pinned_for_ms(e.pinned_until > now ? (e.pinned_until - now) / kNanosPerMs : 0);
  out.set_live_leases(e.live_leases);
  out.set_hits(e.hits);
  out.set_has_parent(e.has_parent);
  out.set_children(e.children);
  out.set_namespace_(e.ns);
  return out;
}

Result<StateKind> DecodeKind(v1::StateKind kind) {
  switch (kind) {
    case v1::GLOBAL_KV:
      return StateKind::kGlobalKv;
    case v1::SWA_STATE:
      return StateKind::kSwaState;
    default:
      return InvalidArgument("unknown state kind " + std::to_string(static_cast<int>(kind)));
  }
}

v1::StateKind EncodeKind(StateKind kind) {
  return kind == StateKind::kGlobalKv ? v1::GLOBAL_KV : v1::SWA_STATE;
}

Status DecodeEntryRef(const v1::EntryRef& in, EntryCursor* out) {
  STRATA_RETURN_IF_ERROR(Digest(in.key(), "entry key", &out->key));
  Result<StateKind> kind = DecodeKind(in.kind());
  if (!kind.ok()) return kind.status();
  out->kind = *kind;
  return Status::Ok();
}

v1::EntryRef EncodeEntryRef(const ChainKey& key, StateKind kind) {
  v1::EntryRef out;
  out.set_key(Bytes(key));
  out.set_kind(EncodeKind(kind));
  return out;
}

Status DecodeEntryFilter(const v1::EntryFilter& in, DecodedFilter* out) {
  if (in.namespace_().size() > 4096) return InvalidArgument("namespace longer than 4096 bytes");
  out->ns = in.namespace_();
  EntryFilter& f = out->filter;
  if (!in.model_id().empty()) {
    ModelId model;
    STRATA_RETURN_IF_ERROR(Digest(in.model_id(), "model_id", &model));
    f.model_id = model;
  }
  if (in.kind() != v1::STATE_KIND_UNSPECIFIED) {
    Result<StateKind> kind = DecodeKind(in.kind());
    if (!kind.ok()) return kind.status();
    f.kind = *kind;
  }
  constexpr uint64_t kMaxAgeS = uint64_t{100} * 365 * 24 * 3600;  // keeps the nanos in range
  if (in.older_than_s() > kMaxAgeS) return InvalidArgument("older_than_s above 100 years");
  f.older_than = static_cast<Nanos>(in.older_than_s()) * kNanosPerSecond;
  switch (in.pinned()) {
    case v1::EntryFilter::PINNED_ANY:
      break;
    case v1::EntryFilter::PINNED_ONLY:
      f.pinned = true;
      break;
    case v1::EntryFilter::UNPINNED_ONLY:
      f.pinned = false;
      break;
    default:
      return InvalidArgument("unknown pinned filter");
  }
  if (in.tier() != v1::TIER_UNSPECIFIED) {
    Result<Tier> tier = DecodeTier(in.tier());
    if (!tier.ok()) return tier.status();
    f.tier = *tier;
  }
  return Status::Ok();
}

std::string EncodePageToken(const EntryCursor& cursor) {
  std::string token = Bytes(cursor.key);
  token.push_back(static_cast<char>(cursor.kind));
  return token;
}

Result<std::optional<EntryCursor>> DecodePageToken(const std::string& token) {
  if (token.empty()) return std::optional<EntryCursor>();
  if (token.size() != 17) return InvalidArgument("malformed page token");
  EntryCursor cursor;
  STRATA_RETURN_IF_ERROR(Digest(token.substr(0, 16), "page token", &cursor.key));
  const auto kind = static_cast<uint8_t>(token[16]);
  if (kind != static_cast<uint8_t>(StateKind::kGlobalKv) &&
      kind != static_cast<uint8_t>(StateKind::kSwaState)) {
    return InvalidArgument("malformed page token");
  }
  cursor.kind = static_cast<StateKind>(kind);
  return std::optional<EntryCursor>(cursor);
}

}  // namespace strata::wire
