# Checks that every #include follows the layering of docs/architecture.md:
# a library includes only its own headers and those of the layers below it,
# a public header (cachestore/include/strata/) only public headers, and the
# worker and the tools only what their layer may see. Run by the build
# (target strata_check_layers) before any library compiles, so a layering
# mistake is a build error.
#
#   cmake -DSOURCE_DIR=<repo> [-DSTAMP=<file>] -P cmake/CheckLayers.cmake

cmake_minimum_required(VERSION 3.25)

# Each layer and the layers it uses directly (the rest follows).
set(deps_util "")
set(deps_format util)
set(deps_eviction format)
set(deps_ssd eviction)
set(deps_store ssd)
set(deps_rpc store)
set(deps_dataplane util)
set(deps_remote rpc dataplane)
set(deps_cluster remote)
set(deps_client cluster)
set(deps_node cluster)
set(layers util format eviction ssd store rpc dataplane remote cluster client node)

# The layer of each public header (cachestore/include/strata/<name>.h).
set(public_util status clock json_text task_pool metrics http_server http_endpoint)
set(public_format chain_key layout store_types store)
set(public_ssd ssd_options)
set(public_store arena_options cache_store)
set(public_remote client_options)
set(public_cluster membership)
set(public_client client)

# below_<layer>: the layer and everything under it.
foreach(layer IN LISTS layers)
  set(closure ${layer})
  set(todo ${deps_${layer}})
  while(todo)
    list(POP_FRONT todo next)
    if(NOT next IN_LIST closure)
      list(APPEND closure ${next})
      list(APPEND todo ${deps_${next}})
    endif()
  endwhile()
  set(below_${layer} ${closure})
endforeach()

set(errors "")
# check(<file> <layers whose public headers it may use> <layers whose
# internal headers it may use>)
function(check file allowed internal_allowed)
  if(NOT EXISTS "${file}")
    return()
  endif()
  file(STRINGS "${file}" lines REGEX "^#include \"")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^#include \"([^\"]+)\"")
      continue()
    endif()
    set(path "${CMAKE_MATCH_1}")
    set(target_layer "")
    set(kind "")
    if(path MATCHES "^strata/([a-z_]+)\\.h$")
      set(name "${CMAKE_MATCH_1}")
      foreach(layer IN LISTS layers)
        if(name IN_LIST public_${layer})
          set(target_layer ${layer})
        endif()
      endforeach()
      if(NOT target_layer AND EXISTS "${SOURCE_DIR}/cachestore/include/strata/${name}.h")
        list(APPEND errors "cmake/CheckLayers.cmake: public header strata/${name}.h has no layer")
      endif()
      set(kind public)
    elseif(path MATCHES "^([a-z_]+)/[a-z_/]+\\.h$" AND CMAKE_MATCH_1 IN_LIST layers)
      set(target_layer "${CMAKE_MATCH_1}")
      set(kind internal)
    endif()
    if(NOT target_layer)
      continue()
    endif()
    string(REPLACE "${SOURCE_DIR}/" "" rel "${file}")
    if(NOT target_layer IN_LIST allowed)
      list(JOIN allowed ", " allowed_text)
      list(APPEND errors "${rel}: includes ${path} of layer '${target_layer}', which is not below it (allowed: ${allowed_text})")
    elseif(kind STREQUAL "internal" AND NOT target_layer IN_LIST internal_allowed)
      if(internal_allowed)
        list(JOIN internal_allowed ", " internal_text)
        list(APPEND errors "${rel}: includes the internal header ${path}; only those of ${internal_text} are allowed here")
      else()
        list(APPEND errors "${rel}: includes the internal header ${path}; only public headers (strata/) are allowed here")
      endif()
    endif()
  endforeach()
  set(errors "${errors}" PARENT_SCOPE)
endfunction()

function(check_dir dir allowed internal_allowed)
  file(GLOB_RECURSE files "${SOURCE_DIR}/${dir}/*.h" "${SOURCE_DIR}/${dir}/*.cc" "${SOURCE_DIR}/${dir}/*.cu"
    "${SOURCE_DIR}/${dir}/*.cuh")
  foreach(file IN LISTS files)
    check("${file}" "${allowed}" "${internal_allowed}")
  endforeach()
  set(errors "${errors}" PARENT_SCOPE)
endfunction()

foreach(layer IN LISTS layers)
  check_dir(cachestore/src/${layer} "${below_${layer}}" "${below_${layer}}")
  foreach(name IN LISTS public_${layer})
    check("${SOURCE_DIR}/cachestore/include/strata/${name}.h" "${below_${layer}}" "")
  endforeach()
endforeach()
# The worker links the client layer; of the internals, only eviction's (its
# HBM tier orders pages with the store's policies). The kernels nothing of
# the store.
check_dir(worker "${below_client}" "eviction")
# The router: the client layer's public headers (and the worker's), no internals.
check_dir(router "${below_client}" "")
check_dir(kernels "" "")
check_dir(tools/trace "${below_client}" "")
# strata-admin speaks the node's gRPC protocol: it may use the rpc and
# cluster internals (status mapping, membership), nothing of the node.
check_dir(tools/admin "${below_client}" "rpc;cluster")

if(errors)
  list(JOIN errors "\n  " text)
  message(FATAL_ERROR "Layering violations (docs/architecture.md):\n  ${text}")
endif()
if(STAMP)
  file(TOUCH "${STAMP}")
endif()
