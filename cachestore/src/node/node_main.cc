// strata-node: serves a CacheStore (see node/node.h and
// deploy/strata-node.yaml). SIGTERM or SIGINT stops it gracefully.
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string_view>
#include <thread>

#include "node/node.h"
#include "node/token_auth.h"
#include "strata/json_text.h"

namespace {

// %* in a pattern: the message, escaped for a JSON string (messages quote
// status texts, which may hold quotes, backslashes and newlines).
class JsonEscapedMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*tm*/,
              spdlog::memory_buf_t& dest) override {
    const std::string quoted =
        strata::JsonString(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(quoted.data() + 1, quoted.data() + quoted.size() - 1);  // the pattern quotes
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

void SetUpLogging(const strata::NodeConfig& config) {
  if (config.log_format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonEscapedMessage>('*').set_pattern(
        R"({"ts":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","msg":"%*"})");
    spdlog::set_formatter(std::move(formatter));
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %l %v", spdlog::pattern_time_type::utc);
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level));
}

// Each control-plane connection costs the node three descriptors (the
// client's, the relay's and gRPC's end): take the hard limit, so that the
// front door's connection cap, not the default soft limit of 1024, bounds
// them.
void RaiseDescriptorLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &lim);
  }
}

}  // namespace

int main(int argc, char** argv) {
  RaiseDescriptorLimit();
  CLI::App app{"strata-node: a Strata cache storage node"};
  std::string config_path;
  std::vector<std::string> overrides;
  std::string listen, http_listen, tokens_file, dram_bytes;
  app.add_option("--config", config_path, "YAML config file (deploy/strata-node.yaml)");
  app.add_option("--set", overrides, "Override a config key: --set dram_bytes=8GiB (repeatable)");
  app.add_option("--listen", listen, "gRPC host:port (overrides the config)");
  app.add_option("--http-listen", http_listen, "HTTP /metrics host:port ('' disables)");
  app.add_option("--tokens-file", tokens_file, "Bearer tokens file");
  app.add_option("--dram-bytes", dram_bytes, "DRAM tier size, e.g. 8GiB");
  std::string token;
  CLI::App* hash = app.add_subcommand("hash-token", "Print the tokens-file line form of a token");
  hash->add_option("token", token, "The bearer token")->required();
  CLI11_PARSE(app, argc, argv);

  if (hash->parsed()) {
    std::cout << strata::HashToken(token) << "\n";
    return 0;
  }

  strata::NodeConfig config;
  if (!config_path.empty()) {
    auto loaded = strata::LoadNodeConfig(config_path);
    if (!loaded.ok()) {
      std::cerr << "strata-node: " << loaded.status().ToString() << "\n";
      return 2;
    }
    config = std::move(loaded).value();
  }
  auto set = [&](const std::string& key, const std::string& value) {
    return value.empty() ? strata::Status::Ok()
                         : strata::ApplyNodeConfigOverride(&config, key + "=" + value);
  };
  strata::Status st = set("listen", listen);
  if (st.ok()) st = set("tokens_file", tokens_file);
  if (st.ok()) st = set("dram_bytes", dram_bytes);
  if (st.ok() && app.count("--http-listen") > 0) config.http_listen = http_listen;
  for (const std::string& o : overrides) {
    if (st.ok()) st = strata::ApplyNodeConfigOverride(&config, o);
  }
  // Before logging is set up from it: a bad log_level must not silence this.
  if (st.ok()) st = strata::ValidateNodeConfig(config);
  if (!st.ok()) {
    std::cerr << "strata-node: " << st.ToString() << "\n";
    return 2;
  }
  SetUpLogging(config);

  // Signals go to one waiting thread, never to a thread inside gRPC or UCX.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto node = strata::Node::Start(config);
  if (!node.ok()) {
    spdlog::error("event=node_start_failed error=\"{}\"", node.status().ToString());
    return 1;
  }
  // Tests and launchers read the chosen ports from this line.
  std::printf("strata-node listening grpc=%d http=%d node_id=%s\n", (*node)->grpc_port(),
              (*node)->http_port(), (*node)->node_id().c_str());
  std::fflush(stdout);

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("event=signal signal={}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    (*node)->Shutdown();
  });
  (*node)->Wait();
  waiter.join();
  node->reset();  // ends every lease and reservation, frees the arena
  spdlog::info("event=node_exit");
  return 0;
}
