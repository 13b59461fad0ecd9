// The one interface every client uses (DESIGN §3), whether the store runs
// in this process or behind a node. A Store is bound to one caller's
// credentials; the namespace never travels in a request.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "strata/store_types.h"

namespace strata {

class CacheStore;

class Store {
 public:
  virtual ~Store() = default;

  virtual Result<MatchResult> Match(const MatchRequest& request) = 0;
  virtual Result<MatchResult> MatchKeys(const MatchKeysRequest& request) = 0;
  // `request.match` and the buffers must outlive the returned future.
  virtual FetchFuture Fetch(const FetchRequest& request) = 0;
  // The reserved buffers stay valid until Publish or Abort; a remote store
  // reclaims those of a reservation left alone for one more lease TTL past
  // its expiry (the node dropped it at expiry).
  virtual Result<Reservation> Reserve(const ModelId& model, std::span<const CommitBlock> blocks,
                                      Nanos write_lease_ttl = 0) = 0;
  virtual Result<PublishResult> Publish(LeaseId write_lease,
                                        std::span<const uint64_t> checksums) = 0;
  virtual Result<PublishResult> Commit(const ModelId& model,
                                       std::span<const CommitPayload> payloads) = 0;
  virtual Status RenewLease(LeaseId lease, Nanos ttl) = 0;
  virtual Status Abort(LeaseId lease) = 0;
  // The namespace this store's credentials name (the in-process caller's,
  // or what the node maps the token to). A caller that derives chain keys
  // itself (ChainKeys::ForPrompt, MatchKeys) must put it in key[0]: keys
  // derived under another namespace never match what the store holds for
  // this caller. A cluster store may have to reach a node first
  // (UNAVAILABLE when none answers).
  virtual Result<std::string> CallerNamespace() = 0;
  // Ends a read lease without waiting for the store to confirm it: the hot
  // path after a fetch. A remote store sends it with its next call (or
  // within a few milliseconds); a lease never released still ends at its
  // expiry. A write lease released is aborted. Default: Abort, ignoring the
  // outcome.
  virtual void Release(LeaseId lease) { (void)Abort(lease); }
};

// `inproc://`: calls straight into a CacheStore shared with its owner.
std::unique_ptr<Store> OpenInProcessStore(std::shared_ptr<CacheStore> store, Principal caller);

}  // namespace strata
