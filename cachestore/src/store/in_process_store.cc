#include "strata/cache_store.h"
#include "strata/store.h"

namespace strata {
namespace {

class InProcessStore final : public Store {
 public:
  InProcessStore(std::shared_ptr<CacheStore> store, Principal caller)
      : store_(std::move(store)), caller_(std::move(caller)) {}

  Result<MatchResult> Match(const MatchRequest& request) override {
    return store_->Match(caller_, request);
  }
  Result<MatchResult> MatchKeys(const MatchKeysRequest& request) override {
    return store_->MatchKeys(caller_, request);
  }
  FetchFuture Fetch(const FetchRequest& request) override {
    return store_->Fetch(caller_, request);
  }
  Result<Reservation> Reserve(const ModelId& model, std::span<const CommitBlock> blocks,
                              Nanos write_lease_ttl) override {
    return store_->Reserve(caller_, model, blocks, write_lease_ttl);
  }
  Result<PublishResult> Publish(LeaseId write_lease, std::span<const uint64_t> checksums) override {
    return store_->Publish(caller_, write_lease, checksums);
  }
  Result<PublishResult> Commit(const ModelId& model,
                               std::span<const CommitPayload> payloads) override {
    return store_->Commit(caller_, model, payloads);
  }
  Status RenewLease(LeaseId lease, Nanos ttl) override {
    return store_->RenewLease(caller_, lease, ttl);
  }
  Status Abort(LeaseId lease) override { return store_->Abort(caller_, lease); }
  Result<std::string> CallerNamespace() override { return caller_.ns; }

 private:
  std::shared_ptr<CacheStore> store_;
  Principal caller_;
};

}  // namespace

std::unique_ptr<Store> OpenInProcessStore(std::shared_ptr<CacheStore> store, Principal caller) {
  return std::make_unique<InProcessStore>(std::move(store), std::move(caller));
}

}  // namespace strata
