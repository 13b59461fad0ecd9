#include "ssd/ssd_index.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <cstring>
#include <span>

#include "strata/layout.h"

namespace strata {
namespace {

constexpr uint8_t kKeyVersion = 1;
// 2: data_checksum is bound to the key (KeyBoundChecksum). Version-1
// records are dropped at open, as any record that does not decode.
constexpr uint8_t kMetaVersion = 2;
constexpr size_t kMetaBytes = 1 + 4 + 8 * 6 + 4 + 2 + 8 * 3;

template <typename T>
void Append(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // little-endian hosts only (x86-64, arm64)
  out.append(buf, sizeof(T));
}

template <typename T>
bool Take(std::string_view& in, T* v) {
  if (in.size() < sizeof(T)) return false;
  std::memcpy(v, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}

Status FromRocks(const rocksdb::Status& s, const char* what) {
  if (s.ok()) return Status::Ok();
  return Unavailable(std::string("SSD index ") + what + ": " + s.ToString());
}

}  // namespace

// Key: version, u32 namespace length, namespace, model id, chain key, kind.
std::string EncodeSsdKeyPrefix(std::string_view ns) {
  std::string out;
  out.reserve(1 + 4 + ns.size() + 33);
  Append<uint8_t>(out, kKeyVersion);
  Append<uint32_t>(out, static_cast<uint32_t>(ns.size()));
  out.append(ns);
  return out;
}

std::string EncodeSsdKey(const SsdKey& key) {
  std::string out = EncodeSsdKeyPrefix(key.ns);
  out.append(reinterpret_cast<const char*>(key.model_id.bytes.data()), key.model_id.bytes.size());
  out.append(reinterpret_cast<const char*>(key.chain.bytes.data()), key.chain.bytes.size());
  Append<uint8_t>(out, static_cast<uint8_t>(key.kind));
  return out;
}

std::optional<SsdKey> DecodeSsdKey(std::string_view in) {
  SsdKey key;
  uint8_t version = 0, kind = 0;
  uint32_t ns_len = 0;
  if (!Take(in, &version) || version != kKeyVersion || !Take(in, &ns_len) || in.size() < ns_len) {
    return std::nullopt;
  }
  key.ns.assign(in.substr(0, ns_len));
  in.remove_prefix(ns_len);
  if (in.size() != 16 + 16 + 1) return std::nullopt;
  std::memcpy(key.model_id.bytes.data(), in.data(), 16);
  std::memcpy(key.chain.bytes.data(), in.data() + 16, 16);
  kind = static_cast<uint8_t>(in[32]);
  if (kind != static_cast<uint8_t>(StateKind::kGlobalKv) &&
      kind != static_cast<uint8_t>(StateKind::kSwaState)) {
    return std::nullopt;
  }
  key.kind = static_cast<StateKind>(kind);
  return key;
}

uint64_t KeyBoundChecksum(uint64_t payload_checksum, const SsdKey& key) {
  const std::string encoded = EncodeSsdKey(key);
  return payload_checksum ^ Checksum64(std::as_bytes(std::span(encoded)));
}

std::string EncodeSsdMeta(const SsdEntryMeta& m) {
  std::string out;
  out.reserve(kMetaBytes);
  Append<uint8_t>(out, kMetaVersion);
  Append<uint32_t>(out, m.file);
  Append<uint64_t>(out, m.offset);
  Append<uint64_t>(out, m.extent_bytes);
  Append<uint64_t>(out, m.payload_bytes);
  Append<uint64_t>(out, m.data_checksum);
  Append<uint64_t>(out, m.entry_checksum);
  Append<int64_t>(out, m.commit_time);
  Append<uint32_t>(out, m.layout_id);
  Append<uint16_t>(out, m.layout_version);
  Append<int64_t>(out, m.expiry);
  Append<int64_t>(out, m.last_access);
  Append<int64_t>(out, 0);  // reserved
  return out;
}

std::optional<SsdEntryMeta> DecodeSsdMeta(std::string_view in) {
  SsdEntryMeta m;
  uint8_t version = 0;
  int64_t reserved = 0;
  if (in.size() != kMetaBytes || !Take(in, &version) || version != kMetaVersion) {
    return std::nullopt;
  }
  const bool ok = Take(in, &m.file) && Take(in, &m.offset) && Take(in, &m.extent_bytes) &&
                  Take(in, &m.payload_bytes) && Take(in, &m.data_checksum) &&
                  Take(in, &m.entry_checksum) && Take(in, &m.commit_time) &&
                  Take(in, &m.layout_id) && Take(in, &m.layout_version) && Take(in, &m.expiry) &&
                  Take(in, &m.last_access) && Take(in, &reserved);
  if (!ok) return std::nullopt;
  return m;
}

Result<std::unique_ptr<SsdIndex>> SsdIndex::Open(const std::string& path) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, &db);
  if (!s.ok()) return Unavailable("cannot open the SSD index at " + path + ": " + s.ToString());
  return std::unique_ptr<SsdIndex>(new SsdIndex(db));
}

SsdIndex::~SsdIndex() {
  if (db_ != nullptr) {
    (void)db_->Close();
    delete db_;
  }
}

Status SsdIndex::Apply(std::span<const std::pair<std::string, SsdEntryMeta>> puts,
                       std::span<const std::string> deletes, bool sync) {
  if (puts.empty() && deletes.empty()) return Status::Ok();
  rocksdb::WriteBatch batch;
  for (const std::string& k : deletes) STRATA_RETURN_IF_ERROR(FromRocks(batch.Delete(k), "delete"));
  for (const auto& [k, meta] : puts) {
    STRATA_RETURN_IF_ERROR(FromRocks(batch.Put(k, EncodeSsdMeta(meta)), "put"));
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  return FromRocks(db_->Write(wo, &batch), "write");
}

Status SsdIndex::ForEach(const std::function<void(std::string_view, std::string_view)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    fn(std::string_view(it->key().data(), it->key().size()),
       std::string_view(it->value().data(), it->value().size()));
  }
  return FromRocks(it->status(), "scan");
}

}  // namespace strata
