// Helpers for tests against a real etcd: a started server per test, and
// waiting for a condition with a bound (a hang fails the test instead of
// stalling the suite).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "etcd_process.h"
#include "temp_dir.h"

namespace strata::testing {

// Polls `done` every 20 ms until it holds or `limit` passes; true if it held.
inline bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

// A fixture with one etcd server (skips the test when etcd is absent).
class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissing;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = TempDir(std::string(info->test_suite_name()) + "-" + info->name());
    std::string error;
    etcd_ = EtcdProcess::Start(dir_ + "/etcd", &error);
    ASSERT_NE(etcd_, nullptr) << error;
  }
  void TearDown() override {
    etcd_.reset();
    if (!dir_.empty() && !HasFailure()) std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  std::unique_ptr<EtcdProcess> etcd_;
};

}  // namespace strata::testing
