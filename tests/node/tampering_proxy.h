// A control-plane proxy in front of a real node that can rewrite the node's
// answers, to test how a client takes a node that answers wrong (a bug, or
// a release it does not understand). The data plane is not proxied: Hello
// hands the client the node's own UCX address.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "strata/v1/cache.grpc.pb.h"

namespace strata::testing {

class TamperingProxy final : public v1::CacheStore::Service {
 public:
  explicit TamperingProxy(const std::string& node_target)
      : node_(v1::CacheStore::NewStub(
            grpc::CreateChannel(node_target, grpc::InsecureChannelCredentials()))) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~TamperingProxy() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  // "host:port" to open a store on; empty if the proxy could not listen.
  std::string target() const {
    return server_ == nullptr ? "" : "127.0.0.1:" + std::to_string(port_);
  }

  // Rewrites the node's next answers of that kind (nullptr: passes them).
  void TamperMatch(std::function<void(v1::MatchResponse*)> f) {
    std::lock_guard lock(mu_);
    on_match_ = std::move(f);
  }
  void TamperReserve(std::function<void(v1::ReserveResponse*)> f) {
    std::lock_guard lock(mu_);
    on_reserve_ = std::move(f);
  }
  void TamperHello(std::function<void(v1::HelloResponse*)> f) {
    std::lock_guard lock(mu_);
    on_hello_ = std::move(f);
  }

  grpc::Status Hello(grpc::ServerContext* ctx, const v1::HelloRequest* req,
                     v1::HelloResponse* resp) override {
    return Tampered(
        Forward(*ctx, [&](grpc::ClientContext* c) { return node_->Hello(c, *req, resp); }),
        on_hello_, resp);
  }
  grpc::Status Match(grpc::ServerContext* ctx, const v1::MatchRequest* req,
                     v1::MatchResponse* resp) override {
    return Tampered(
        Forward(*ctx, [&](grpc::ClientContext* c) { return node_->Match(c, *req, resp); }),
        on_match_, resp);
  }
  grpc::Status Reserve(grpc::ServerContext* ctx, const v1::ReserveRequest* req,
                       v1::ReserveResponse* resp) override {
    return Tampered(
        Forward(*ctx, [&](grpc::ClientContext* c) { return node_->Reserve(c, *req, resp); }),
        on_reserve_, resp);
  }
  grpc::Status Publish(grpc::ServerContext* ctx, const v1::PublishRequest* req,
                       v1::PublishResponse* resp) override {
    return Forward(*ctx, [&](grpc::ClientContext* c) { return node_->Publish(c, *req, resp); });
  }
  grpc::Status Abort(grpc::ServerContext* ctx, const v1::AbortRequest* req,
                     v1::AbortResponse* resp) override {
    return Forward(*ctx, [&](grpc::ClientContext* c) { return node_->Abort(c, *req, resp); });
  }
  grpc::Status RenewLease(grpc::ServerContext* ctx, const v1::RenewLeaseRequest* req,
                          v1::RenewLeaseResponse* resp) override {
    return Forward(*ctx, [&](grpc::ClientContext* c) { return node_->RenewLease(c, *req, resp); });
  }

 private:
  // The node's answer, rewritten by `tamper` if it is set and the call went well.
  template <typename Resp>
  grpc::Status Tampered(grpc::Status st, const std::function<void(Resp*)>& tamper, Resp* resp) {
    std::lock_guard lock(mu_);
    if (st.ok() && tamper) tamper(resp);
    return st;
  }

  // Calls the node with the caller's credentials.
  template <typename Fn>
  static grpc::Status Forward(const grpc::ServerContext& ctx, Fn fn) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    for (const auto& [key, value] : ctx.client_metadata()) {
      if (key == "authorization")
        c.AddMetadata(std::string(key.data(), key.size()), std::string(value.data(), value.size()));
    }
    return fn(&c);
  }

  std::unique_ptr<v1::CacheStore::Stub> node_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;
  std::function<void(v1::MatchResponse*)> on_match_;
  std::function<void(v1::ReserveResponse*)> on_reserve_;
  std::function<void(v1::HelloResponse*)> on_hello_;
};

}  // namespace strata::testing
