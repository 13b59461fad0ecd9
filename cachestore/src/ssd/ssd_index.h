// The SSD tier's index in RocksDB: (namespace, model id, chain key, kind) ->
// SsdEntryMeta. Keys and values have a fixed little-endian encoding with a
// version byte, so a value from a newer format is recognised, not misread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "ssd/ssd_tier.h"
#include "strata/status.h"

namespace rocksdb {
class DB;
}

namespace strata {

std::string EncodeSsdKey(const SsdKey& key);
// The bytes every encoded key of namespace `ns` starts with.
std::string EncodeSsdKeyPrefix(std::string_view ns);
std::optional<SsdKey> DecodeSsdKey(std::string_view bytes);
// What an index record's data_checksum holds: the payload's Checksum64
// bound to the entry's key, so a record that points at another key's bytes
// (a misdirected or swapped index entry) fails its read like a corrupt one.
uint64_t KeyBoundChecksum(uint64_t payload_checksum, const SsdKey& key);
std::string EncodeSsdMeta(const SsdEntryMeta& meta);
std::optional<SsdEntryMeta> DecodeSsdMeta(std::string_view bytes);

class SsdIndex {
 public:
  static Result<std::unique_ptr<SsdIndex>> Open(const std::string& path);
  ~SsdIndex();
  SsdIndex(const SsdIndex&) = delete;
  SsdIndex& operator=(const SsdIndex&) = delete;

  // One atomic batch of puts and deletes (encoded keys); `sync` waits until
  // it is on stable storage.
  Status Apply(std::span<const std::pair<std::string, SsdEntryMeta>> puts,
               std::span<const std::string> deletes, bool sync);
  // Every stored (encoded key, raw value), in key order.
  Status ForEach(const std::function<void(std::string_view, std::string_view)>& fn) const;

 private:
  explicit SsdIndex(rocksdb::DB* db) : db_(db) {}
  rocksdb::DB* db_;
};

}  // namespace strata
