// Layout descriptors and the payload format (DESIGN §8).
//
// A payload is one stored block of one state kind: a header followed by the
// layer groups, laid out group-major so a fetch can hand group g to the
// caller as soon as it has arrived and been verified.
//
// Header (little-endian, padded with zeros to a multiple of 64 bytes):
//   off  size  field
//     0     4  magic "STRA"
//     4     2  format version (1)
//     6     1  state kind (1 = GLOBAL_KV, 2 = SWA_STATE)
//     7     1  reserved, 0
//     8     4  layout id
//    12     4  token count (GLOBAL_KV: tokens in the block; SWA: live ring slots)
//    16     4  group count G
//    20     4  header bytes H (the body starts here)
//    24     8  body bytes
//    32  24*G  group table: u64 offset (from payload start), u64 length, u64 xxh3-64
//
// Checksums: each group carries the xxh3-64 of its bytes; the entry checksum
// is the xxh3-64 of the H header bytes, so it covers every group checksum and
// thus the whole payload. Verifying a payload means checking the header
// against the entry checksum and each group against its table entry.
#pragma once

#include <absl/container/inlined_vector.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata {

enum class StateKind : uint8_t { kGlobalKv = 1, kSwaState = 2 };
std::string_view StateKindName(StateKind kind);

// A vector of low-precision values with one scale per `scale_group` values.
struct ScaledFormat {
  uint32_t values;
  uint32_t value_bits;
  uint32_t scale_group;
  uint32_t scale_bits;
  constexpr uint64_t Bytes() const {
    return uint64_t{values} * value_bits / 8 + uint64_t{values} / scale_group * scale_bits / 8;
  }
};
constexpr ScaledFormat kMainKvEntry{512, 4, 16, 8};   // FP4 e2m1 + one scale byte per 16
constexpr ScaledFormat kIndexerEntry{128, 4, 32, 8};  // FP4 e2m1 + one scale byte per 32
constexpr ScaledFormat kSwaPosition{512, 8, 32, 8};   // MXFP8 e4m3 + E8M0 per 32
static_assert(kMainKvEntry.Bytes() == 288 && kIndexerEntry.Bytes() == 68);
static_assert(kSwaPosition.Bytes() == 528);

struct LayerGroup {
  std::string name;
  uint64_t bytes = 0;
};

struct Layout {
  uint32_t id = 0;
  StateKind kind = StateKind::kGlobalKv;
  // GLOBAL_KV: tokens per block (the header's token count must equal it).
  // SWA_STATE: ring slots per layer (the header's token count is at most it).
  uint32_t block_tokens = 0;
  std::vector<LayerGroup> groups;

  uint64_t BodyBytes() const;
  uint32_t HeaderBytes() const;
  uint64_t PayloadBytes() const { return HeaderBytes() + BodyBytes(); }
  Status Validate() const;
};

// Global KV as in DeepSeek-V4.1: each source emits one main + one indexer
// entry every `stride` tokens. Defaults: encoder sources at stride 1 and 2,
// the decoder source at stride 1 -> (1 + 1/2 + 1) x 356 B = 890 B/token.
struct GlobalKvSource {
  std::string name;
  uint32_t stride = 1;
};
struct GlobalKvShape {
  uint32_t block_tokens = 256;
  ScaledFormat main = kMainKvEntry;
  ScaledFormat indexer = kIndexerEntry;
  std::vector<GlobalKvSource> sources = {
      {"encoder.stride1", 1}, {"encoder.stride2", 2}, {"decoder.stride1", 1}};
  // Bytes of global KV per raw token (may be fractional per source; exact
  // for the whole block).
  double BytesPerToken() const;
};
Layout MakeGlobalKvLayout(uint32_t id, const GlobalKvShape& shape = {});

// Sliding-window state: per layer a ring of window + speculative slots,
// then a `lineage` group: a digest of the global KV entries the rings were
// computed over (the producer's to define; the worker chains their entry
// checksums). Two runs can publish different global KV under the same
// chain keys (an encoder bounded replay approximates it), so a reader
// pairs a state only with the exact bytes it descends from.
constexpr uint64_t kSwaLineageBytes = 8;
struct SwaShape {
  uint32_t layers = 8;
  uint32_t window = 128;
  uint32_t speculative_slots = 6;
  ScaledFormat position = kSwaPosition;
  bool lineage = true;
  uint32_t Slots() const { return window + speculative_slots; }
};
Layout MakeSwaLayout(uint32_t id, const SwaShape& shape = {});

// Layouts as text, for configuration (a node's `extra_layouts`):
//
//   <id>:<kind>:<block_tokens>:<groups>
//     kind    global_kv | swa_state
//     groups  name=bytes[,name=bytes...], or `v41` (global_kv only): the
//             V4.1 global KV groups for block_tokens (MakeGlobalKvLayout)
//
// e.g. "900:global_kv:512:meta=1" or "901:global_kv:512:v41". Several
// layouts are separated by ';'. The result is validated (Layout::Validate),
// with ids from 1 and block_tokens up to kMaxBlockTokens.
Result<Layout> ParseLayoutSpec(std::string_view spec);
Result<std::vector<Layout>> ParseLayoutSpecs(std::string_view specs);
// The explicit form (groups spelled out). ParseLayoutSpec reads it back when
// no group name holds ':', ';', ',' or '=' (true of every built-in layout).
std::string FormatLayoutSpec(const Layout& layout);

// The built-in layouts every store knows.
constexpr uint32_t kV41GlobalKvLayoutId = 1;
constexpr uint32_t kV41SwaLayoutId = 2;
// The version of the two V4.1 layouts together, which a V4.1 worker hashes
// into its model fingerprint (ModelFingerprint::kv_layout_version) so that
// workers of different versions never share state. Bump it whenever either
// layout's bytes change. 2: the SWA layout gained its last `lineage` group.
constexpr uint32_t kV41KvLayoutVersion = 2;
// The V4.1 state's precision, the fingerprint's `precision`.
constexpr const char* kV41Precision = "fp4-e2m1+mxfp8";

// ---- Payload header --------------------------------------------------------

constexpr uint32_t kPayloadMagic = 0x41525453;  // "STRA" little-endian
constexpr uint16_t kPayloadFormatVersion = 1;
constexpr uint32_t kMaxLayerGroups = 256;
constexpr uint64_t kMaxLayerGroupBytes = uint64_t{1} << 40;  // a whole layout's body, at most

struct GroupExtent {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
};

struct PayloadHeader {
  StateKind kind = StateKind::kGlobalKv;
  uint32_t layout_id = 0;
  uint32_t token_count = 0;
  uint32_t header_bytes = 0;
  uint64_t body_bytes = 0;
  // Inline for every built-in layout (global KV 3 groups, SWA state 9): a
  // header is parsed for every block committed or fetched, and a heap
  // allocation per parse was a tenth of a metadata-only replay's commits.
  absl::InlinedVector<GroupExtent, 9> groups;
};

uint64_t Checksum64(std::span<const std::byte> bytes);  // xxh3-64, seed 0
// Copies n bytes and returns Checksum64 of the bytes copied, hashing each
// cache-sized chunk from the destination while it is still in cache: what a
// reader gets is exactly what was verified, in one pass over the source. Safe for a source that may
// change during the call (a mapped remote arena whose lease runs out mid-copy): a change yields a
// checksum mismatch, never a copy that differs from what was hashed.
uint64_t CopyAndChecksum(std::byte* dst, const std::byte* src, size_t n);

// Writes the header into the first layout.HeaderBytes() of `payload`, whose
// body the caller has already filled. Returns the entry checksum.
Result<uint64_t> SealPayload(const Layout& layout, uint32_t token_count,
                             std::span<std::byte> payload);

// Parses and bounds-checks a header. Does not verify checksums.
Result<PayloadHeader> ParsePayloadHeader(std::span<const std::byte> payload);

// Checks a parsed header against the layout it claims (kind, sizes, groups).
Status CheckHeaderMatchesLayout(const PayloadHeader& header, const Layout& layout);

// Full verification: header parses, matches the layout, its bytes hash to
// `checksum`, every group hashes to its table entry.
Status VerifyPayload(const Layout& layout, std::span<const std::byte> payload, uint64_t checksum);

}  // namespace strata
