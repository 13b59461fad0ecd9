// Temporary directories for tests and benchmarks.
#pragma once

#include <string>

namespace strata::testing {

// $TEST_TMPDIR (or /tmp)/strata-<name>-<pid>, emptied and created; left for
// a failed test's logs to be read.
std::string TempDir(const std::string& name);

// A fresh directory under /var/tmp (disk-backed, so O_DIRECT works; /tmp
// may be a tmpfs), removed with everything in it when the object goes.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix = "strata-test");
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace strata::testing
