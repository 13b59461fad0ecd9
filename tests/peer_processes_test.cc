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

TEST(PeerProcessesTest, AKilledProcessIsReportedOnceWithItsEndpointsForgotten) {
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

  kill(victim, SIGKILL);
  waitpid(victim, nullptr, 0);
  EXPECT_EQ(WaitForExits(peers), std::vector<pid_t>{victim});
  EXPECT_EQ(peers.PidOf(&a), 0);
  EXPECT_EQ(peers.PidOf(&b), 0);
  EXPECT_EQ(peers.PidOf(&c), bystander);
  EXPECT_TRUE(peers.TakeExited().empty()) << "reported once";

  // An exited process is seen without being reaped first, too.
  kill(bystander, SIGKILL);
  EXPECT_EQ(WaitForExits(peers), std::vector<pid_t>{bystander});
  waitpid(bystander, nullptr, 0);
  EXPECT_EQ(peers.processes(), 0u);
  EXPECT_EQ(peers.endpoints(), 0u);
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

TEST(PeerProcessesTest, AnEndpointNamesTheProcessOfItsLatestHello) {
  PeerProcesses peers;
  const pid_t first = SpawnSleeper();
  const pid_t second = SpawnSleeper();
  ASSERT_TRUE(peers.Watch(&a, first));
  ASSERT_TRUE(peers.Watch(&a, second));
  EXPECT_EQ(peers.PidOf(&a), second);
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  EXPECT_EQ(WaitForExits(peers), std::vector<pid_t>{first});
  EXPECT_EQ(peers.PidOf(&a), second) << "the endpoint moved on";
  kill(second, SIGKILL);
  waitpid(second, nullptr, 0);
}

// A flood of hellos holds at most kMaxEndpoints endpoints (one process
// here; the process bound works the same way, one pidfd each).
TEST(PeerProcessesTest, AFloodOfHellosIsBounded) {
  PeerProcesses peers;
  const pid_t child = SpawnSleeper();
  std::vector<char> endpoints(PeerProcesses::kMaxEndpoints + 100);
  size_t watched = 0;
  for (char& e : endpoints) watched += peers.Watch(&e, child) ? 1 : 0;
  EXPECT_EQ(watched, PeerProcesses::kMaxEndpoints);
  EXPECT_EQ(peers.endpoints(), PeerProcesses::kMaxEndpoints);
  EXPECT_EQ(peers.processes(), 1u);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(WaitForExits(peers), std::vector<pid_t>{child});
  EXPECT_EQ(peers.endpoints(), 0u);
}

}  // namespace
}  // namespace strata::dataplane::internal
