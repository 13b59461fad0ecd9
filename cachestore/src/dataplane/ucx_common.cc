#include "dataplane/ucx_common.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "dataplane/data_plane.h"

namespace strata::dataplane {

std::string_view ModeName(Mode mode) {
  switch (mode) {
    case Mode::kAuto:
      return "auto";
    case Mode::kRma:
      return "rma";
    case Mode::kActiveMessage:
      return "am";
  }
  return "unknown";
}

Result<Mode> ParseMode(std::string_view name) {
  for (Mode m : {Mode::kAuto, Mode::kRma, Mode::kActiveMessage}) {
    if (name == ModeName(m)) return m;
  }
  return InvalidArgument("data-plane mode must be auto, rma or am, got '" + std::string(name) +
                         "'");
}

std::string HostId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return std::string(host) + "/" + boot_id;
}

}  // namespace strata::dataplane

namespace strata::dataplane::internal {

Status StatusFromUcs(ucs_status_t status, const std::string& what) {
  std::string message = what + ": " + ucs_status_string(status);
  switch (status) {
    case UCS_OK:
      return Status::Ok();
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CANCELED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NO_DEVICE:
      return Unavailable(std::move(message));
    case UCS_ERR_TIMED_OUT:
      return DeadlineExceeded(std::move(message));
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
      return ResourceExhausted(std::move(message));
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return InvalidArgument(std::move(message));
    default:
      return Internal(std::move(message));
  }
}

StatusCode StatusCodeFromWire(uint32_t code) {
  if (code > static_cast<uint32_t>(StatusCode::kInternal)) return StatusCode::kInternal;
  return static_cast<StatusCode>(code);
}

UcxWorker::~UcxWorker() {
  if (worker != nullptr) ucp_worker_destroy(worker);
  if (context != nullptr) ucp_cleanup(context);
}

Result<std::unique_ptr<UcxWorker>> CreateUcxWorker(const UcxWorkerOptions& options) {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return StatusFromUcs(st, "ucp_config_read");
  if (!options.net_devices.empty()) {
    std::string devices;
    for (const std::string& d : options.net_devices) devices += (devices.empty() ? "" : ",") + d;
    st = ucp_config_modify(config, "NET_DEVICES", devices.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return StatusFromUcs(st, "setting UCX_NET_DEVICES=" + devices);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | (options.rma ? UCP_FEATURE_RMA : 0) |
                    (options.wakeup ? UCP_FEATURE_WAKEUP : 0);
  params.mt_workers_shared = 0;
  auto handles = std::make_unique<UcxWorker>();
  st = ucp_init(&params, config, &handles->context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    handles->context = nullptr;
    return StatusFromUcs(st, "ucp_init (check UCX_TLS and UCX_NET_DEVICES)");
  }
  Result<ucp_worker_h> worker = CreateWorker(handles->context, options.thread_mode);
  if (!worker.ok()) return worker.status();
  handles->worker = *worker;
  return handles;
}

Result<ucp_worker_h> CreateWorker(ucp_context_h context, ucs_thread_mode_t thread_mode) {
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = thread_mode;
  ucp_worker_h worker = nullptr;
  ucs_status_t st = ucp_worker_create(context, &wparams, &worker);
  if (st != UCS_OK) return StatusFromUcs(st, "ucp_worker_create");
  return worker;
}

namespace {
constexpr Nanos kDefaultClientTeardownGrace = 2 * kNanosPerSecond;
std::atomic<Nanos> client_teardown_grace{kDefaultClientTeardownGrace};
std::atomic<uint64_t> client_worker_teardowns{0};
}  // namespace

Nanos ClientTeardownGrace() { return client_teardown_grace.load(std::memory_order_relaxed); }

void SetClientTeardownGraceForTesting(Nanos grace) {
  client_teardown_grace.store(grace < 0 ? kDefaultClientTeardownGrace : grace,
                              std::memory_order_relaxed);
}

uint64_t ClientWorkerTeardownsForTesting() { return client_worker_teardowns.load(); }
void CountClientWorkerTeardown() { client_worker_teardowns.fetch_add(1); }

Status SetAmHandler(ucp_worker_h worker, uint16_t id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                     UCP_AM_HANDLER_PARAM_FIELD_ARG;
  param.id = id;
  param.cb = cb;
  param.arg = arg;
  return StatusFromUcs(ucp_worker_set_am_recv_handler(worker, &param),
                       "ucp_worker_set_am_recv_handler");
}

std::string CaptureUcxPrint(const std::function<void(FILE*)>& print) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buf, &size);
  if (stream == nullptr) return {};
  print(stream);
  std::fclose(stream);
  std::string out(buf, size);
  std::free(buf);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  return out;
}

std::vector<std::string> ContextTransports(ucp_context_h context) {
  // Lines look like "#      resource 1  :  md 0  dev 1  flags -- tcp/eth0".
  std::string text = CaptureUcxPrint([&](FILE* f) { ucp_context_print_info(context, f); });
  std::vector<std::string> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("resource") == std::string::npos) continue;
    size_t dashes = line.find("-- ");
    if (dashes == std::string::npos) continue;
    std::string name = line.substr(dashes + 3);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\r')) name.pop_back();
    if (!name.empty()) out.push_back(name);
  }
  return out;
}

std::vector<EpLane> EpLanes(ucp_ep_h ep) {
  // Lines look like
  // "#  lane[2]:  2:cma/memory.0 md[2]  -> md[2]/cma/sysdev[255] rma_bw#0".
  std::string text = CaptureUcxPrint([&](FILE* f) { ucp_ep_print_info(ep, f); });
  std::vector<EpLane> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    size_t lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    size_t colon = line.find(':', lane);
    if (colon == std::string::npos) continue;
    std::istringstream fields(line.substr(colon + 1));
    std::string resource;  // "2:cma/memory.0"
    fields >> resource;
    size_t index_end = resource.find(':');
    if (index_end != std::string::npos) resource = resource.substr(index_end + 1);
    size_t dot = resource.rfind('.');
    if (dot != std::string::npos) resource = resource.substr(0, dot);
    EpLane parsed;
    parsed.transport = resource;
    parsed.rma_bw = line.find("rma_bw") != std::string::npos;
    out.push_back(std::move(parsed));
  }
  return out;
}

namespace {
std::string TransportName(const std::string& transport) {
  return transport.substr(0, transport.find('/'));
}
}  // namespace

bool IsSharedMemoryTransport(const std::string& transport) {
  const std::string name = TransportName(transport);
  return name == "posix" || name == "sysv" || name == "xpmem" || name == "cma" || name == "knem" ||
         name == "self";
}

bool IsTcpTransport(const std::string& transport) { return TransportName(transport) == "tcp"; }

bool IsCmaTransport(const std::string& transport) { return TransportName(transport) == "cma"; }

bool IsRdmaTransport(const std::string& transport) {
  const std::string name = TransportName(transport);
  return name.rfind("rc", 0) == 0 || name.rfind("dc", 0) == 0;
}

Status WaitRequest(ucp_worker_h worker, ucs_status_ptr_t request, Nanos deadline,
                   const std::string& what) {
  if (request == nullptr) return Status::Ok();
  if (UCS_PTR_IS_ERR(request)) return StatusFromUcs(UCS_PTR_STATUS(request), what);
  ucs_status_t st = UCS_INPROGRESS;
  while ((st = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    if (SteadyNow() > deadline) break;
    ucp_worker_progress(worker);
  }
  ucp_request_free(request);
  if (st == UCS_INPROGRESS) return DeadlineExceeded(what + " did not finish in time");
  return StatusFromUcs(st, what);
}

}  // namespace strata::dataplane::internal
