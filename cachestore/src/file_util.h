// Reading a small file (a tokens file, a certificate) whole.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "strata/status.h"

namespace strata {

inline Result<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return Internal("error reading " + path);
  return text.str();
}

}  // namespace strata
