// Reading a small file (a tokens file, a certificate) whole.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "strata/status.h"

namespace strata {

// A directory (which std::ifstream opens and reads as empty on Linux) or
// any other non-regular file is an error, not an empty file.
inline Result<std::string> ReadFileToString(const std::string& path) {
  std::error_code ec;
  const auto type = std::filesystem::status(path, ec).type();
  if (type == std::filesystem::file_type::directory) {
    return InvalidArgument(path + " is a directory, not a file");
  }
  if (!ec && type != std::filesystem::file_type::regular) {
    return InvalidArgument(path + " is not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return Internal("error reading " + path);
  return text.str();
}

}  // namespace strata
