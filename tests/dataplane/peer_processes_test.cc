// PeerProcesses: how a node learns that a client process on its host has
// exited (issue #39), and what a flood of hellos can make it hold.
#include "dataplane/peer_processes.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace strata::dataplane::internal {
namespace {

// A child that waits to be killed.
pid_t SpawnSleeper() {
  const pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

// Polls TakeExited for up to 5 s until it names something.
std::vector<pid_t> WaitForExits(PeerProcesses& peers) {
  for (int i = 0; i < 500; ++i) {
    std::vector<pid_t> exited = peers.TakeExited();
    if (!exited.empty()) return exited;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {};
}

int a, b, c;  // stand-ins for endpoints

TEST(PeerProcessesTest, AKilledProcessIsReportedOnceAndItsEndpointsCountAsExited) {
  PeerProcesses peers;
  const pid_t victim = SpawnSleeper();
  const pid_t bystander = SpawnSleeper();
  ASSERT_GT(victim, 0);
  ASSERT_GT(bystander, 0);
  ASSERT_TRUE(peers.Watch(&a, victim));
  ASSERT_TRUE(peers.Watch(&b, victim));
  ASSERT_TRUE(peers.Watch(&c, bystander));
  EXPECT_EQ(peers.PidOf(&a), victim);
  EXPECT_EQ(peers.processes(), 2u);
  EXPECT_TRUE(peers.TakeExited().empty()) << "both are alive";
  EXPECT_FALSE(peers.HasExited(&a));

  kill(victim, SIGKILL);
  waitpid(victim, nullptr, 0);
  EXPECT_EQ(WaitForExits(peers), std::vector<pid_t>{victim});
  EXPECT_EQ(peers.PidOf(&a), 0);
  EXPECT_EQ(peers.PidOf(&b), 0);
  // Requests still queued from a and b get no reply now.
  EXPECT_TRUE(peers.HasExited(&a));
  EXPECT_TRUE(peers.HasExited(&b));
  EXPECT_EQ(peers.PidOf(&c), bystander);
  EXPECT_FALSE(peers.HasExited(&c));
  EXPECT_TRUE(peers.TakeExited().empty()) << "reported once";

  // An exited process is seen without being reaped first, too.
  kill(bystander, SIGKILL);
  EXPECT_EQ(WaitForExits(peers), std::vector<pid_t>{bystander});
  waitpid(bystander, nullptr, 0);
  EXPECT_EQ(peers.processes(), 0u);
  EXPECT_EQ(peers.endpoints(), 0u);

  // An endpoint UCX hands out again starts over with its next hello.
  peers.Forget(&a);
  EXPECT_FALSE(peers.HasExited(&a));
}

TEST(PeerProcessesTest, ClaimsThatCannotBeWatchedAreRefused) {
  PeerProcesses peers;
  EXPECT_FALSE(peers.Watch(&a, 0));
  EXPECT_FALSE(peers.Watch(&a, 1)) << "init";
  EXPECT_FALSE(peers.Watch(&a, -5));
  EXPECT_FALSE(peers.Watch(&a, getpid())) << "the node itself";
  // A pid no process has (pid_max is at most 2^22).
  EXPECT_FALSE(peers.Watch(&a, (1 << 22) + 17));
  EXPECT_EQ(peers.PidOf(&a), 0);
  EXPECT_EQ(peers.processes(), 0u);
}

// An endpoint names the process of its latest hello; a refused or absent
// one forgets the earlier, and a pidfd nobody names is closed at once, so
// an endpoint holds at most one.
TEST(PeerProcessesTest, AnEndpointNamesOnlyTheProcessOfItsLatestHello) {
  PeerProcesses peers;
  const pid_t first = SpawnSleeper();
  const pid_t second = SpawnSleeper();
  ASSERT_TRUE(peers.Watch(&a, first));
  ASSERT_TRUE(peers.Watch(&a, second));
  EXPECT_EQ(peers.PidOf(&a), second);
  EXPECT_EQ(peers.processes(), 1u) << "first's pidfd is closed";
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(peers.TakeExited().empty()) << "first is no longer watched";
  EXPECT_EQ(peers.PidOf(&a), second);
  EXPECT_FALSE(peers.Watch(&a, 1));
  EXPECT_EQ(peers.PidOf(&a), 0) << "a refused hello forgets the earlier one";
  EXPECT_EQ(peers.processes(), 0u);
  kill(second, SIGKILL);
  waitpid(second, nullptr, 0);
}

// Hellos from many endpoints of one process keep at most
// kMaxEndpointsPerProcess (the newest), and the process one pidfd.
TEST(PeerProcessesTest, AFloodOfHellosIsBounded) {
  PeerProcesses peers;
  const pid_t child = SpawnSleeper();
  std::vector<char> endpoints(PeerProcesses::kMaxEndpointsPerProcess * 10);
  for (char& e : endpoints) EXPECT_TRUE(peers.Watch(&e, child));
  EXPECT_EQ(peers.endpoints(), PeerProcesses::kMaxEndpointsPerProcess);
  EXPECT_EQ(peers.processes(), 1u);
  EXPECT_EQ(peers.PidOf(&endpoints.back()), child);
  EXPECT_EQ(peers.PidOf(&endpoints.front()), 0) << "the oldest were forgotten";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(WaitForExits(peers), std::vector<pid_t>{child});
  EXPECT_EQ(peers.endpoints(), 0u);
  EXPECT_TRUE(peers.HasExited(&endpoints.back()));
}

}  // namespace
}  // namespace strata::dataplane::internal
