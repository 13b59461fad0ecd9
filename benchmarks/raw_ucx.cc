#include "raw_ucx.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "dataplane/data_plane.h"

namespace strata::bench {
namespace {

constexpr uint16_t kRawRequest = 21;
constexpr uint16_t kRawReply = 22;

struct RawHeader {
  uint64_t slot = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

Status UcsError(ucs_status_t st, const char* what) {
  return Internal(std::string(what) + ": " + ucs_status_string(st));
}

// ---- pipe helpers: blobs from the child to the parent ----

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool WriteBlob(int fd, const std::string& s) {
  uint64_t n = s.size();
  return WriteAll(fd, &n, sizeof(n)) && WriteAll(fd, s.data(), s.size());
}
bool ReadBlob(int fd, std::string* s) {
  uint64_t n = 0;
  if (!ReadAll(fd, &n, sizeof(n)) || n > (1u << 20)) return false;
  s->resize(n);
  return ReadAll(fd, s->data(), n);
}

// What a node child publishes: worker address, rkey, buffer base, host id.
struct NodeBlobs {
  std::string address, rkey, host_id;
  uint64_t base = 0;
};
bool WriteNodeBlobs(int fd, const NodeBlobs& b) {
  return WriteBlob(fd, b.address) && WriteBlob(fd, b.rkey) && WriteAll(fd, &b.base, 8) &&
         WriteBlob(fd, b.host_id);
}

// A forked node process; closing `to_child` tells it to exit.
class NodeChild {
 public:
  // `serve(to_parent_fd, from_parent_fd)` runs in the child and returns its
  // exit code.
  static Result<std::unique_ptr<NodeChild>> Fork(const std::function<int(int, int)>& serve) {
    int down[2];
    int up[2];
    if (pipe(down) != 0 || pipe(up) != 0) return Internal("pipe failed");
    pid_t pid = fork();
    if (pid < 0) return Internal("fork failed");
    if (pid == 0) {
      close(down[1]);
      close(up[0]);
      _exit(serve(up[1], down[0]));
    }
    close(down[0]);
    close(up[1]);
    auto child = std::unique_ptr<NodeChild>(new NodeChild(pid, down[1]));
    int in = up[0];
    bool ok = ReadBlob(in, &child->blobs.address) && ReadBlob(in, &child->blobs.rkey) &&
              ReadAll(in, &child->blobs.base, 8) && ReadBlob(in, &child->blobs.host_id);
    close(in);
    if (!ok) return Unavailable("node child failed to start (see its stderr)");
    return child;
  }
  ~NodeChild() {
    close(to_child_);
    for (int i = 0; i < 200; ++i) {  // up to 2 s to exit cleanly
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  NodeBlobs blobs;

 private:
  NodeChild(pid_t pid, int to_child) : pid_(pid), to_child_(to_child) {}
  pid_t pid_;
  int to_child_;
};

// ---- raw UCX: context + worker ----

struct RawWorker {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ~RawWorker() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }
};

Status InitRawWorker(RawWorker* w, bool wakeup) {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcsError(st, "ucp_config_read");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | (wakeup ? UCP_FEATURE_WAKEUP : 0);
  st = ucp_init(&params, config, &w->context);
  ucp_config_release(config);
  if (st != UCS_OK) return UcsError(st, "ucp_init");
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(w->context, &wp, &w->worker);
  if (st != UCS_OK) return UcsError(st, "ucp_worker_create");
  return Status::Ok();
}

// ---- raw node (child) ----

struct RawNode {
  RawWorker ucx;
  std::vector<std::byte> buffer;
  std::byte* base = nullptr;  // buffer, or the UCX-allocated region
  bool eager_replies = false;
};

void RawReplySent(void* request, ucs_status_t /*status*/, void* user_data) {
  ucp_request_free(request);
  delete static_cast<RawHeader*>(user_data);
}

ucs_status_t RawOnRequest(void* arg, const void* header, size_t header_length, void* /*data*/,
                          size_t /*length*/, const ucp_am_recv_param_t* param) {
  auto* node = static_cast<RawNode*>(arg);
  if (header_length != sizeof(RawHeader) ||
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) {
    return UCS_OK;
  }
  auto* h = new RawHeader();
  std::memcpy(h, header, sizeof(*h));
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &RawReplySent;
  p.user_data = h;
  if (node->eager_replies) {
    p.flags = UCP_AM_SEND_FLAG_EAGER;
  } else if (h->length >= 8192) {
    p.flags = UCP_AM_SEND_FLAG_RNDV;
  }
  ucs_status_ptr_t r = ucp_am_send_nbx(param->reply_ep, kRawReply, h, sizeof(*h),
                                       node->base + h->offset, h->length, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) delete h;
  return UCS_OK;
}

int ServeRaw(const RawUcxOptions& o, int up, int down) {
  RawNode node;
  node.eager_replies = o.eager_replies;
  node.buffer.assign(o.blocks * o.block_bytes, std::byte{0x5a});
  Status st = InitRawWorker(&node.ucx, /*wakeup=*/true);
  if (!st.ok()) {
    std::fprintf(stderr, "raw node: %s\n", st.ToString().c_str());
    return 1;
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = o.ucx_allocated ? nullptr : node.buffer.data();
  mp.length = node.buffer.size();
  mp.flags = o.ucx_allocated ? UCP_MEM_MAP_ALLOCATE : 0;
  ucp_mem_h memh = nullptr;
  if (ucp_mem_map(node.ucx.context, &mp, &memh) != UCS_OK) return 1;
  std::byte* base = node.buffer.data();
  if (o.ucx_allocated) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    if (ucp_mem_query(memh, &attr) != UCS_OK) return 1;
    base = static_cast<std::byte*>(attr.address);
    std::memset(base, 0x5a, node.buffer.size());
  }
  node.base = base;
  void* rkey = nullptr;
  size_t rkey_size = 0;
  if (ucp_rkey_pack(node.ucx.context, memh, &rkey, &rkey_size) != UCS_OK) return 1;
  ucp_address_t* addr = nullptr;
  size_t addr_size = 0;
  if (ucp_worker_get_address(node.ucx.worker, &addr, &addr_size) != UCS_OK) return 1;
  NodeBlobs blobs;
  blobs.address.assign(reinterpret_cast<const char*>(addr), addr_size);
  blobs.rkey.assign(static_cast<const char*>(rkey), rkey_size);
  blobs.base = reinterpret_cast<uint64_t>(base);
  blobs.host_id = dataplane::HostId();
  ucp_worker_release_address(node.ucx.worker, addr);
  ucp_rkey_buffer_release(rkey);
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = kRawRequest;
  hp.cb = &RawOnRequest;
  hp.arg = &node;
  if (ucp_worker_set_am_recv_handler(node.ucx.worker, &hp) != UCS_OK) return 1;
  if (!WriteNodeBlobs(up, blobs)) return 1;
  close(up);
  // Progress like a node would on a shared machine: spin while busy, sleep
  // on the worker's event fd (and the parent's pipe) when idle.
  int efd = -1;
  if (ucp_worker_get_efd(node.ucx.worker, &efd) != UCS_OK) return 1;
  double last_active = NowSeconds();
  while (true) {
    if (ucp_worker_progress(node.ucx.worker) != 0) {
      last_active = NowSeconds();
      continue;
    }
    if (NowSeconds() - last_active < 100e-6) continue;
    ucs_status_t armed = ucp_worker_arm(node.ucx.worker);
    if (armed == UCS_ERR_BUSY) continue;
    pollfd fds[2] = {{efd, POLLIN, 0}, {down, POLLIN, 0}};
    poll(fds, 2, -1);
    if (fds[1].revents != 0) break;  // parent closed the pipe
    last_active = NowSeconds();
  }
  ucp_mem_unmap(node.ucx.context, memh);
  return 0;
}

// ---- raw client (parent) ----

struct RawClient {
  struct Slot {
    RawHeader header;
    std::vector<std::byte> dest;
    bool busy = false;
    int requests = 0;  // UCX requests in flight for this slot
    bool data_done = false;
  };
  RawWorker ucx;
  ucp_ep_h ep = nullptr;
  ucp_rkey_h rkey = nullptr;
  std::vector<Slot> slots;
  std::vector<size_t> done;

  static void Finished(Slot* s, RawClient* c) {
    if (s->requests == 0 && s->data_done) {
      s->busy = false;
      c->done.push_back(static_cast<size_t>(s - c->slots.data()));
    }
  }
};

struct RawCtx {
  RawClient* client;
  size_t slot;
};

void RawSent(void* request, ucs_status_t /*status*/, void* user_data) {
  ucp_request_free(request);
  auto* ctx = static_cast<RawCtx*>(user_data);
  auto& s = ctx->client->slots[ctx->slot];
  --s.requests;
  RawClient::Finished(&s, ctx->client);
}

void RawGetDone(void* request, ucs_status_t /*status*/, void* user_data) {
  ucp_request_free(request);
  auto* ctx = static_cast<RawCtx*>(user_data);
  auto& s = ctx->client->slots[ctx->slot];
  --s.requests;
  s.data_done = true;
  RawClient::Finished(&s, ctx->client);
}

void RawReplyReceived(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  RawGetDone(request, status, user_data);
}

std::vector<RawCtx>* g_ctx = nullptr;  // per-slot callback contexts of the running client

ucs_status_t RawOnReply(void* arg, const void* header, size_t header_length, void* data,
                        size_t length, const ucp_am_recv_param_t* param) {
  auto* c = static_cast<RawClient*>(arg);
  if (header_length != sizeof(RawHeader)) return UCS_OK;
  RawHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (h.slot >= c->slots.size()) return UCS_OK;
  auto& s = c->slots[h.slot];
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    std::memcpy(s.dest.data(), data, std::min<size_t>(length, s.dest.size()));
    s.data_done = true;
    RawClient::Finished(&s, c);
    return UCS_OK;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &RawReplyReceived;
  p.user_data = &(*g_ctx)[h.slot];
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(c->ucx.worker, data, s.dest.data(), length, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    s.data_done = true;
    RawClient::Finished(&s, c);
  } else {
    ++s.requests;
  }
  return UCS_OK;
}

Result<double> MeasureRaw(const RawUcxOptions& o, const NodeBlobs& node) {
  RawClient c;
  STRATA_RETURN_IF_ERROR(InitRawWorker(&c.ucx, /*wakeup=*/false));
  bool local_shm = false;  // same rule as DataPlaneClient: shm needs no error handling
  {
    char* buf = nullptr;
    size_t size = 0;
    FILE* f = open_memstream(&buf, &size);
    ucp_context_print_info(c.ucx.context, f);
    std::fclose(f);
    std::string info(buf, size);
    std::free(buf);  // NOLINT(cppcoreguidelines-no-malloc)
    local_shm = info.find("posix/") != std::string::npos ||
                info.find("sysv/") != std::string::npos || info.find("cma/") != std::string::npos;
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(node.address.data());
  ep.err_mode = local_shm ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  ucs_status_t st = ucp_ep_create(c.ucx.worker, &ep, &c.ep);
  if (st != UCS_OK) return UcsError(st, "ucp_ep_create");
  if (o.pattern == UcxFetchPattern::kRma) {
    st = ucp_ep_rkey_unpack(c.ep, node.rkey.data(), &c.rkey);
    if (st != UCS_OK) return UcsError(st, "ucp_ep_rkey_unpack");
  }
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = kRawReply;
  hp.cb = &RawOnReply;
  hp.arg = &c;
  ucp_worker_set_am_recv_handler(c.ucx.worker, &hp);
  c.slots.resize(o.depth);
  std::vector<RawCtx> ctx(o.depth);
  g_ctx = &ctx;
  for (size_t i = 0; i < o.depth; ++i) {
    c.slots[i].dest.assign(o.block_bytes, std::byte{0});
    ctx[i] = {&c, i};
  }
  uint64_t next_block = 0;
  auto issue = [&](size_t i) {
    auto& s = c.slots[i];
    s.busy = true;
    s.data_done = false;
    s.header = {i, (next_block++ % o.blocks) * o.block_bytes, o.block_bytes};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.user_data = &ctx[i];
    ucs_status_ptr_t r;
    if (o.pattern == UcxFetchPattern::kRma) {
      p.cb.send = &RawGetDone;
      r = ucp_get_nbx(c.ep, s.dest.data(), o.block_bytes, node.base + s.header.offset, c.rkey, &p);
      if (r == nullptr || UCS_PTR_IS_ERR(r)) s.data_done = true;
    } else {
      p.cb.send = &RawSent;
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_AM_SEND_FLAG_REPLY;
      r = ucp_am_send_nbx(c.ep, kRawRequest, &s.header, sizeof(s.header), nullptr, 0, &p);
    }
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) ++s.requests;
    RawClient::Finished(&s, &c);
  };
  for (size_t i = 0; i < o.depth; ++i) issue(i);
  const double warm_until = NowSeconds() + 0.2;
  double start = 0;
  double end = 0;
  uint64_t bytes = 0;
  bool measuring = false;
  while (true) {
    ucp_worker_progress(c.ucx.worker);
    if (c.done.empty()) continue;
    double now = NowSeconds();
    if (!measuring && now >= warm_until) {
      measuring = true;
      start = now;
      end = start + o.seconds;
    }
    std::vector<size_t> ready;
    ready.swap(c.done);
    if (measuring) bytes += ready.size() * o.block_bytes;
    if (measuring && now >= end) {
      end = now;
      break;
    }
    for (size_t i : ready) issue(i);
  }
  // Let the ops in flight finish before tearing down.
  auto busy = [&] {
    for (auto& s : c.slots) {
      if (s.busy) return true;
    }
    return false;
  };
  const double give_up = NowSeconds() + 5;
  while (busy() && NowSeconds() < give_up) ucp_worker_progress(c.ucx.worker);
  if (c.rkey != nullptr) ucp_rkey_destroy(c.rkey);
  ucp_request_param_t cp{};
  ucs_status_ptr_t r = ucp_ep_close_nbx(c.ep, &cp);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && NowSeconds() < give_up) {
      ucp_worker_progress(c.ucx.worker);
    }
    ucp_request_free(r);
  }
  g_ctx = nullptr;
  if (busy()) return Internal("raw UCX fetches did not finish");
  return static_cast<double>(bytes) / (end - start) / 1e9;
}

// ---- data plane node (child) and client ----

int ServeDataPlane(const RawUcxOptions& o, int up, int down) {
  std::vector<std::byte> buffer(o.blocks * o.block_bytes, std::byte{0x5a});
  dataplane::Access access;
  auto allow = [](uint64_t, uint64_t, uint64_t, uint64_t) -> Result<dataplane::TransferHold> {
    return dataplane::TransferHold();
  };
  access.authorize_read = allow;
  access.authorize_write = allow;
  auto server = o.ucx_allocated ? dataplane::DataPlaneServer::StartWithOwnRegion(
                                      buffer.size(), std::move(access), {})
                                : dataplane::DataPlaneServer::Start(buffer, std::move(access), {});
  if (!server.ok()) {
    std::fprintf(stderr, "data plane node: %s\n", server.status().ToString().c_str());
    return 1;
  }
  // Same bytes as the raw node's buffer (and no untouched zero pages).
  std::memset((*server)->region().data(), 0x5a, (*server)->region().size());
  NodeBlobs blobs{(*server)->worker_address(), (*server)->packed_rkey(), (*server)->host_id(),
                  (*server)->region_base()};
  if (!WriteNodeBlobs(up, blobs)) return 1;
  close(up);
  char c;
  while (read(down, &c, 1) > 0) {
  }
  return 0;
}

Result<double> MeasureDataPlane(const RawUcxOptions& o, const NodeBlobs& node) {
  dataplane::ServerInfo info{
      node.address, node.rkey, node.base, 1, node.host_id, o.blocks * o.block_bytes};
  dataplane::ClientOptions co;
  co.mode =
      o.pattern == UcxFetchPattern::kRma ? dataplane::Mode::kRma : dataplane::Mode::kActiveMessage;
  auto client = dataplane::DataPlaneClient::Connect(info, co);
  if (!client.ok()) return client.status();
  std::vector<std::vector<std::byte>> dest(o.depth, std::vector<std::byte>(o.block_bytes));
  std::vector<dataplane::DataPlaneClient::ReadOp> ops(o.depth);
  uint64_t next_block = 0;
  auto round = [&]() -> Status {
    for (size_t i = 0; i < o.depth; ++i) {
      ops[i] = {1, (next_block++ % o.blocks) * o.block_bytes, dest[i]};
    }
    return (*client)->Read(ops, nullptr, SteadyClock().Now() + Seconds(30));
  };
  const double warm_until = NowSeconds() + 0.2;
  while (NowSeconds() < warm_until) STRATA_RETURN_IF_ERROR(round());
  uint64_t bytes = 0;
  const double start = NowSeconds();
  double now = start;
  while (now < start + o.seconds) {
    STRATA_RETURN_IF_ERROR(round());
    bytes += o.depth * o.block_bytes;
    now = NowSeconds();
  }
  return static_cast<double>(bytes) / (now - start) / 1e9;
}

Status CheckOptions(const RawUcxOptions& o) {
  if (o.block_bytes == 0 || o.blocks == 0 || o.depth == 0 || o.seconds <= 0) {
    return InvalidArgument("block_bytes, blocks, depth and seconds must be positive");
  }
  if (!o.tls.empty()) setenv("UCX_TLS", o.tls.c_str(), 1);
  return Status::Ok();
}

}  // namespace

Result<double> RawUcxFetchGbps(const RawUcxOptions& options) {
  STRATA_RETURN_IF_ERROR(CheckOptions(options));
  auto child = NodeChild::Fork([&](int up, int down) { return ServeRaw(options, up, down); });
  if (!child.ok()) return child.status();
  return MeasureRaw(options, (*child)->blobs);
}

struct RawUcxServer::Child {
  std::unique_ptr<NodeChild> node;
};

Result<std::unique_ptr<RawUcxServer>> RawUcxServer::Start(const RawUcxOptions& options) {
  STRATA_RETURN_IF_ERROR(CheckOptions(options));
  auto node = NodeChild::Fork([&](int up, int down) { return ServeRaw(options, up, down); });
  if (!node.ok()) return node.status();
  auto child = std::make_unique<Child>();
  child->node = std::move(node).value();
  return std::unique_ptr<RawUcxServer>(new RawUcxServer(options, std::move(child)));
}

RawUcxServer::RawUcxServer(const RawUcxOptions& options, std::unique_ptr<Child> child)
    : options_(options), child_(std::move(child)) {}

RawUcxServer::~RawUcxServer() = default;

Result<double> RawUcxServer::FetchGbps() {
  STRATA_RETURN_IF_ERROR(CheckOptions(options_));
  return MeasureRaw(options_, child_->node->blobs);
}

Result<double> DataPlaneFetchGbps(const RawUcxOptions& options) {
  STRATA_RETURN_IF_ERROR(CheckOptions(options));
  auto child = NodeChild::Fork([&](int up, int down) { return ServeDataPlane(options, up, down); });
  if (!child.ok()) return child.status();
  return MeasureDataPlane(options, (*child)->blobs);
}

int RunUcxBench(const UcxBenchOptions& options) {
  struct Case {
    const char* name;
    const char* tls;
    UcxFetchPattern pattern;
    bool ucx_allocated;
  };
  // shm RMA needs a region UCX allocated (mappable by peers); shm active
  // messages read a plain buffer through cma rendezvous.
  const Case cases[] = {{"shm", "posix,sysv,cma,self", UcxFetchPattern::kRma, true},
                        {"shm", "posix,sysv,cma,self", UcxFetchPattern::kActiveMessage, false},
                        {"tcp", "tcp", UcxFetchPattern::kActiveMessage, false}};
  Table table;
  JsonObject json;
  json.Add("block_bytes", static_cast<double>(options.block_bytes));
  json.Add("depth", static_cast<double>(options.depth));
  for (const Case& c : cases) {
    RawUcxOptions o;
    o.pattern = c.pattern;
    o.block_bytes = options.block_bytes;
    o.depth = options.depth;
    o.seconds = options.seconds;
    o.tls = c.tls;
    o.ucx_allocated = c.ucx_allocated;
    auto raw = RawUcxFetchGbps(o);
    auto plane = DataPlaneFetchGbps(o);
    if (!raw.ok() || !plane.ok()) {
      std::fprintf(stderr, "%s: raw %s, data plane %s\n", c.name, raw.status().ToString().c_str(),
                   plane.status().ToString().c_str());
      return 1;
    }
    const std::string mode = c.pattern == UcxFetchPattern::kRma ? "rma" : "am";
    const double ratio = *plane / *raw;
    table.Add(std::string(c.name) + " raw UCX (" + mode + ")", Fixed(*raw, 2) + " GB/s");
    table.Add(std::string(c.name) + " data plane (" + mode + ")", Fixed(*plane, 2) + " GB/s",
              Fixed(ratio, 2) + "x raw (target >= 0.70)");
    const std::string key = std::string(c.name) + "_" + mode;
    json.Add(key + "_raw_gbps", *raw);
    json.Add(key + "_data_plane_gbps", *plane);
    json.Add(key + "_ratio", ratio);
  }
  unsetenv("UCX_TLS");
  if (options.json) {
    std::printf("%s\n", json.Dump().c_str());
  } else {
    table.Print("UCX fetch: " + std::to_string(options.block_bytes) + " B blocks, depth " +
                std::to_string(options.depth));
  }
  return 0;
}

}  // namespace strata::bench
