// Reading and writing the safetensors format (the real one): an 8-byte
// little-endian header length N, N bytes of JSON
//   {"__metadata__": {"k": "v", ...},
//    "name": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [begin, end]}, ...}
// then the tensor bytes, offsets relative to the end of the header.
// Only F32 tensors are written; the reader reports any other dtype by name
// so the loader can reject it with a clear error.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::worker {

struct Tensor {
  std::string dtype = "F32";
  std::vector<uint64_t> shape;
  std::vector<float> data;  // only for F32

  uint64_t Elements() const;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Tensor> tensors;
};

Status WriteSafetensors(const std::string& path, const SafetensorsFile& file);
// Parses and bounds-checks the whole file; errors name the tensor at fault.
Result<SafetensorsFile> ReadSafetensors(const std::string& path);

}  // namespace strata::worker
