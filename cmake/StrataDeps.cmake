# Finds every dependency of the stack (DESIGN §7) and fails with the Debian
# package to install when one is missing. deploy/install-deps.sh installs
# them all.

function(strata_missing what package)
  message(FATAL_ERROR
    "Strata needs ${what}: install the Debian package '${package}' "
    "(or run deploy/install-deps.sh, which installs everything).")
endfunction()

find_package(PkgConfig)
if(NOT PkgConfig_FOUND)
  strata_missing("pkg-config" "pkg-config")
endif()

# find_package(<name>) with a helpful failure.
macro(strata_find_package name package)
  find_package(${name} ${ARGN} QUIET)
  if(NOT ${name}_FOUND)
    strata_missing("${name}" "${package}")
  endif()
endmacro()

# pkg_check_modules(<prefix> IMPORTED_TARGET <module>) with a helpful failure.
macro(strata_find_pkg prefix module package)
  pkg_check_modules(${prefix} QUIET IMPORTED_TARGET GLOBAL ${module})
  if(NOT ${prefix}_FOUND)
    strata_missing("${module} (pkg-config)" "${package}")
  endif()
endmacro()

set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)

strata_find_package(OpenSSL libssl-dev)            # SHA-256 for chain keys, TLS
strata_find_pkg(XXHASH libxxhash libxxhash-dev)    # payload checksums
strata_find_package(Protobuf libprotobuf-dev)      # control plane schemas
strata_find_package(gRPC libgrpc++-dev CONFIG)     # control plane
find_program(STRATA_GRPC_CPP_PLUGIN grpc_cpp_plugin)
if(NOT STRATA_GRPC_CPP_PLUGIN)
  strata_missing("grpc_cpp_plugin" "protobuf-compiler-grpc")
endif()
strata_find_pkg(UCX ucx libucx-dev)                # data plane
strata_find_pkg(IBVERBS libibverbs libibverbs-dev) # RDMA device discovery
strata_find_pkg(URING liburing liburing-dev)       # SSD tier I/O
strata_find_package(RocksDB librocksdb-dev CONFIG) # SSD tier index
strata_find_package(spdlog libspdlog-dev)          # structured logs
strata_find_package(fmt libfmt-dev)
strata_find_package(CLI11 libcli11-dev CONFIG)     # command lines
strata_find_pkg(YAMLCPP yaml-cpp libyaml-cpp-dev)  # node config
strata_find_pkg(HTTPLIB cpp-httplib libcpp-httplib-dev)  # HTTP clients in tests and the bench
strata_find_package(nlohmann_json nlohmann-json3-dev)  # the worker API's request bodies
strata_find_pkg(HIREDIS hiredis libhiredis-dev)    # Redis baseline in benchmarks
strata_find_package(GTest libgtest-dev)
strata_find_package(benchmark libbenchmark-dev)
