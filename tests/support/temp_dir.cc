#include "temp_dir.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace strata::testing {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir =
      std::string(base ? base : "/tmp") + "/strata-" + name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

ScopedTempDir::ScopedTempDir(const std::string& prefix) {
  std::string tmpl = "/var/tmp/" + prefix + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

}  // namespace strata::testing
