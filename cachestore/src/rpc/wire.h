// Conversions between the store's types and the wire schema
// (proto/strata/v1/cache.proto). Decoding validates what the schema cannot:
// 16-byte ids and keys, enum ranges, the documented limits. Malformed input
// is INVALID_ARGUMENT, never a crash. The node and the remote client share
// these, so both sides agree on every field.
#pragma once

#include <vector>

#include "strata/cache_store.h"
#include "strata/status.h"
#include "strata/store_types.h"
#include "strata/v1/cache.pb.h"

namespace strata::wire {

// Keys decoded from a MatchRequest; MatchKeysRequest only borrows them.
struct DecodedMatch {
  MatchKeysRequest request;
  std::vector<ChainKey> keys;
};

v1::MatchRequest EncodeMatchRequest(const MatchKeysRequest& request);
Status DecodeMatchRequest(const v1::MatchRequest& in, DecodedMatch* out);

v1::MatchResponse EncodeMatchResult(const MatchResult& result);
Result<MatchResult> DecodeMatchResponse(const v1::MatchResponse& in);

v1::ReserveRequest EncodeReserveRequest(const ModelId& model, std::span<const CommitBlock> blocks,
                                        Nanos write_lease_ttl);
Status DecodeReserveRequest(const v1::ReserveRequest& in, ModelId* model,
                            std::vector<CommitBlock>* blocks, Nanos* write_lease_ttl);

v1::PublishResponse EncodePublishResult(const PublishResult& result);
PublishResult DecodePublishResponse(const v1::PublishResponse& in);

v1::Code EncodeCode(StatusCode code);
StatusCode DecodeCode(v1::Code code);

// Times become durations relative to `now` (the store's clock).
v1::EntryInfo EncodeEntryInfo(const EntryInfo& info, Nanos now);

Result<StateKind> DecodeKind(v1::StateKind kind);
v1::StateKind EncodeKind(StateKind kind);
Status DecodeEntryRef(const v1::EntryRef& in, EntryCursor* out);
v1::EntryRef EncodeEntryRef(const ChainKey& key, StateKind kind);

// An admin filter; `ns` is the namespace it names (empty: the caller's).
struct DecodedFilter {
  std::string ns;
  EntryFilter filter;
};
Status DecodeEntryFilter(const v1::EntryFilter& in, DecodedFilter* out);

// Listing page tokens: the (key, kind) of the last entry of a page.
std::string EncodePageToken(const EntryCursor& cursor);
Result<std::optional<EntryCursor>> DecodePageToken(const std::string& token);

}  // namespace strata::wire
