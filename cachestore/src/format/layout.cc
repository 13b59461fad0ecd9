#include "strata/layout.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t, for streaming
#include <xxhash.h>
#if defined(__x86_64__)
// Picks the widest SIMD (AVX2/AVX-512) at run time: 2.5x the SSE2 baseline
// the distribution library is built for, and the checksum is on every fetch.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace strata {
namespace {

constexpr uint32_t kFixedHeaderBytes = 32;
constexpr uint32_t kGroupEntryBytes = 24;
constexpr uint32_t kHeaderAlign = 64;

template <typename T>
void Put(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));  // host is little-endian (chain_key.cc asserts it)
}
template <typename T>
T Get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

uint32_t HeaderBytesFor(size_t groups) {
  uint64_t raw = kFixedHeaderBytes + uint64_t{kGroupEntryBytes} * groups;
  return static_cast<uint32_t>((raw + kHeaderAlign - 1) / kHeaderAlign * kHeaderAlign);
}

}  // namespace

std::string_view StateKindName(StateKind kind) {
  switch (kind) {
    case StateKind::kGlobalKv:
      return "GLOBAL_KV";
    case StateKind::kSwaState:
      return "SWA_STATE";
  }
  return "UNKNOWN";
}

uint64_t Layout::BodyBytes() const {
  uint64_t total = 0;
  for (const LayerGroup& g : groups) total += g.bytes;
  return total;
}

uint32_t Layout::HeaderBytes() const { return HeaderBytesFor(groups.size()); }

Status Layout::Validate() const {
  if (kind != StateKind::kGlobalKv && kind != StateKind::kSwaState) {
    return InvalidArgument("layout " + std::to_string(id) + ": unknown state kind");
  }
  if (block_tokens == 0) return InvalidArgument("layout " + std::to_string(id) + ": no tokens");
  if (groups.empty() || groups.size() > kMaxLayerGroups) {
    return InvalidArgument("layout " + std::to_string(id) + ": needs 1.." +
                           std::to_string(kMaxLayerGroups) + " layer groups");
  }
  uint64_t total = 0;
  for (const LayerGroup& g : groups) {
    if (g.bytes == 0) return InvalidArgument("layout " + std::to_string(id) + ": empty group");
    // Bounded so sums cannot wrap; the store's own limit is far lower.
    if (g.bytes > kMaxLayerGroupBytes || total + g.bytes > kMaxLayerGroupBytes) {
      return InvalidArgument("layout " + std::to_string(id) + ": groups too large");
    }
    total += g.bytes;
  }
  return Status::Ok();
}

double GlobalKvShape::BytesPerToken() const {
  double per_entry = static_cast<double>(main.Bytes() + indexer.Bytes());
  double total = 0;
  for (const GlobalKvSource& s : sources) total += per_entry / s.stride;
  return total;
}

Layout MakeGlobalKvLayout(uint32_t id, const GlobalKvShape& shape) {
  Layout layout{id, StateKind::kGlobalKv, shape.block_tokens, {}};
  const uint64_t per_entry = shape.main.Bytes() + shape.indexer.Bytes();
  for (const GlobalKvSource& s : shape.sources) {
    layout.groups.push_back({s.name, shape.block_tokens / s.stride * per_entry});
  }
  return layout;
}

Layout MakeSwaLayout(uint32_t id, const SwaShape& shape) {
  Layout layout{id, StateKind::kSwaState, shape.Slots(), {}};
  for (uint32_t l = 0; l < shape.layers; ++l) {
    layout.groups.push_back({"layer." + std::to_string(l), shape.Slots() * shape.position.Bytes()});
  }
  if (shape.lineage) layout.groups.push_back({"lineage", kSwaLineageBytes});
  return layout;
}

uint64_t Checksum64(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t CopyAndChecksum(std::byte* dst, const std::byte* src, size_t n) {
  // Each chunk is copied with plain (cached) stores and hashed from `dst`
  // while it still sits in L2: the bytes hashed are the bytes the reader
  // got, even from a source that changes under the copy, and the source is
  // read once. Hashing the source and streaming it out (non-temporal
  // stores), or bouncing it through an L1 buffer first, measured 0.6-0.7x
  // this; chunks of 16-64 KiB 0.85-0.95x (strata-bench node's shm fetch,
  // 228 KB blocks, 2-core EPYC).
  constexpr size_t kChunk = 128 * 1024;
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t off = 0; off < n; off += kChunk) {
    const size_t len = std::min(kChunk, n - off);
    std::memcpy(dst + off, src + off, len);
    // The hash must read `dst`: a compiler that could see into it (an
    // inlined xxhash) might otherwise reuse what it loaded from `src`.
    asm volatile("" ::: "memory");
    XXH3_64bits_update(&state, dst + off, len);
  }
  return XXH3_64bits_digest(&state);
}

Result<uint64_t> SealPayload(const Layout& layout, uint32_t token_count,
                             std::span<std::byte> payload) {
  STRATA_RETURN_IF_ERROR(layout.Validate());
  if (payload.size() != layout.PayloadBytes()) {
    return InvalidArgument("payload is " + std::to_string(payload.size()) + " bytes, layout " +
                           std::to_string(layout.id) + " needs " +
                           std::to_string(layout.PayloadBytes()));
  }
  const uint32_t header_bytes = layout.HeaderBytes();
  std::byte* h = payload.data();
  std::memset(h, 0, header_bytes);
  Put<uint32_t>(h + 0, kPayloadMagic);
  Put<uint16_t>(h + 4, kPayloadFormatVersion);
  Put<uint8_t>(h + 6, static_cast<uint8_t>(layout.kind));
  Put<uint32_t>(h + 8, layout.id);
  Put<uint32_t>(h + 12, token_count);
  Put<uint32_t>(h + 16, static_cast<uint32_t>(layout.groups.size()));
  Put<uint32_t>(h + 20, header_bytes);
  Put<uint64_t>(h + 24, layout.BodyBytes());
  uint64_t offset = header_bytes;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const uint64_t len = layout.groups[g].bytes;
    std::byte* e = h + kFixedHeaderBytes + g * kGroupEntryBytes;
    Put<uint64_t>(e + 0, offset);
    Put<uint64_t>(e + 8, len);
    Put<uint64_t>(e + 16, Checksum64(payload.subspan(offset, len)));
    offset += len;
  }
  return Checksum64(payload.first(header_bytes));
}

Result<PayloadHeader> ParsePayloadHeader(std::span<const std::byte> payload) {
  if (payload.size() < kFixedHeaderBytes) {
    return InvalidArgument("payload of " + std::to_string(payload.size()) +
                           " bytes is shorter than a header");
  }
  const std::byte* h = payload.data();
  if (Get<uint32_t>(h) != kPayloadMagic) return InvalidArgument("payload header: bad magic");
  if (Get<uint16_t>(h + 4) != kPayloadFormatVersion) {
    return InvalidArgument("payload header: unsupported format version " +
                           std::to_string(Get<uint16_t>(h + 4)));
  }
  PayloadHeader out;
  const uint8_t kind = Get<uint8_t>(h + 6);
  if (kind != static_cast<uint8_t>(StateKind::kGlobalKv) &&
      kind != static_cast<uint8_t>(StateKind::kSwaState)) {
    return InvalidArgument("payload header: unknown state kind " + std::to_string(kind));
  }
  out.kind = static_cast<StateKind>(kind);
  out.layout_id = Get<uint32_t>(h + 8);
  out.token_count = Get<uint32_t>(h + 12);
  const uint32_t groups = Get<uint32_t>(h + 16);
  out.header_bytes = Get<uint32_t>(h + 20);
  out.body_bytes = Get<uint64_t>(h + 24);
  if (groups == 0 || groups > kMaxLayerGroups) {
    return InvalidArgument("payload header: group count " + std::to_string(groups) +
                           " outside 1.." + std::to_string(kMaxLayerGroups));
  }
  if (out.header_bytes != HeaderBytesFor(groups) || out.header_bytes > payload.size()) {
    return InvalidArgument("payload header: inconsistent header size");
  }
  if (out.body_bytes != payload.size() - out.header_bytes) {
    return InvalidArgument("payload header: body of " + std::to_string(out.body_bytes) +
                           " bytes, payload carries " +
                           std::to_string(payload.size() - out.header_bytes));
  }
  uint64_t expect_offset = out.header_bytes;
  out.groups.resize(groups);
  for (uint32_t g = 0; g < groups; ++g) {
    const std::byte* e = h + kFixedHeaderBytes + g * kGroupEntryBytes;
    GroupExtent& ge = out.groups[g];
    ge.offset = Get<uint64_t>(e + 0);
    ge.length = Get<uint64_t>(e + 8);
    ge.checksum = Get<uint64_t>(e + 16);
    // Groups are contiguous and in order; this also rules out overflow.
    if (ge.offset != expect_offset || ge.length > payload.size() - ge.offset) {
      return InvalidArgument("payload header: group " + std::to_string(g) + " out of bounds");
    }
    expect_offset += ge.length;
  }
  if (expect_offset != payload.size()) {
    return InvalidArgument("payload header: groups do not cover the body");
  }
  return out;
}

Status CheckHeaderMatchesLayout(const PayloadHeader& header, const Layout& layout) {
  if (header.layout_id != layout.id || header.kind != layout.kind) {
    return InvalidArgument("payload header names layout " + std::to_string(header.layout_id) + "/" +
                           std::string(StateKindName(header.kind)) + ", expected " +
                           std::to_string(layout.id) + "/" +
                           std::string(StateKindName(layout.kind)));
  }
  const bool tokens_ok = layout.kind == StateKind::kGlobalKv
                             ? header.token_count == layout.block_tokens
                             : header.token_count <= layout.block_tokens;
  if (!tokens_ok) {
    return InvalidArgument("payload header: token count " + std::to_string(header.token_count) +
                           " does not fit layout " + std::to_string(layout.id));
  }
  if (header.groups.size() != layout.groups.size()) {
    return InvalidArgument("payload header: group count differs from layout");
  }
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    if (header.groups[g].length != layout.groups[g].bytes) {
      return InvalidArgument("payload header: group " + std::to_string(g) + " length " +
                             std::to_string(header.groups[g].length) + " != layout's " +
                             std::to_string(layout.groups[g].bytes));
    }
  }
  return Status::Ok();
}

Status VerifyPayload(const Layout& layout, std::span<const std::byte> payload, uint64_t checksum) {
  Result<PayloadHeader> header = ParsePayloadHeader(payload);
  if (!header.ok()) return header.status();
  STRATA_RETURN_IF_ERROR(CheckHeaderMatchesLayout(*header, layout));
  if (Checksum64(payload.first(header->header_bytes)) != checksum) {
    return ChecksumMismatch("payload header does not match the entry checksum");
  }
  for (size_t g = 0; g < header->groups.size(); ++g) {
    const GroupExtent& ge = header->groups[g];
    if (Checksum64(payload.subspan(ge.offset, ge.length)) != ge.checksum) {
      return ChecksumMismatch("layer group " + std::to_string(g) + " fails its checksum");
    }
  }
  return Status::Ok();
}

}  // namespace strata
