// libFuzzer target: the payload header parser and verifier, and the
// client's decoders of node answers, on arbitrary bytes. None may crash,
// and a payload that verifies must really hash to its checksums.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "rpc/wire.h"
#include "strata/layout.h"

namespace {
// Protobuf logs every malformed string field; the fuzzer makes many.
const bool kQuietProtobuf = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  Result<PayloadHeader> header = ParsePayloadHeader(bytes);
  if (header.ok()) {
    for (const GroupExtent& g : header->groups) {
      if (g.offset > size || g.length > size - g.offset) {
        std::fprintf(stderr, "parser accepted a group outside the payload\n");
        std::abort();
      }
    }
    static const Layout kLayouts[] = {MakeGlobalKvLayout(kV41GlobalKvLayoutId),
                                      MakeSwaLayout(kV41SwaLayoutId)};
    const uint64_t claimed =
        header->header_bytes <= size ? Checksum64(bytes.first(header->header_bytes)) : 0;
    for (const Layout& layout : kLayouts) {
      (void)CheckHeaderMatchesLayout(*header, layout);
      if (VerifyPayload(layout, bytes, claimed).ok()) {
        for (const GroupExtent& g : header->groups) {
          if (Checksum64(bytes.subspan(g.offset, g.length)) != g.checksum) std::abort();
        }
      }
    }
  }
  // The same bytes as node answers the client decodes.
  v1::MatchResponse match;
  if (match.ParseFromArray(data, static_cast<int>(size))) (void)wire::DecodeMatchResponse(match);
  v1::PublishResponse publish;
  if (publish.ParseFromArray(data, static_cast<int>(size))) {
    (void)wire::DecodePublishResponse(publish);
  }
  v1::EntryFilter filter;
  if (filter.ParseFromArray(data, static_cast<int>(size))) {
    wire::DecodedFilter out;
    (void)wire::DecodeEntryFilter(filter, &out);
  }
  (void)wire::DecodePageToken(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
