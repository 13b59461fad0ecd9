# STRATA_WITH_CUDA: AUTO builds CUDA code when /usr/local/cuda/bin/nvcc
# exists; ON requires it; OFF skips it. Architectures are pinned because
# 'native' needs a GPU at build time and the build machines have none.
set(STRATA_HAVE_CUDA OFF)
if(STRATA_WITH_CUDA STREQUAL "AUTO" OR STRATA_WITH_CUDA STREQUAL "ON")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES "${STRATA_CUDA_ARCHITECTURES}")
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA 20 flags for nvcc
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(STRATA_HAVE_CUDA ON)
  elseif(STRATA_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_WITH_CUDA=ON but no nvcc at /usr/local/cuda/bin/nvcc")
  endif()
elseif(NOT STRATA_WITH_CUDA STREQUAL "OFF")
  message(FATAL_ERROR "STRATA_WITH_CUDA must be AUTO, ON or OFF")
endif()
message(STATUS "Strata: CUDA kernels ${STRATA_HAVE_CUDA} (architectures ${STRATA_CUDA_ARCHITECTURES})")
