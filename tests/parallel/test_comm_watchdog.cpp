// CommWatchdog: a mark held past the limit ends the process with the communicator's message, from
// the watchdog's thread while the marking thread stays stuck; marks released in time, or with no
// limit, end nothing; an inner mark keeps the outer call's name. Each case runs in a forked child
// (the watchdog ends its process), its stderr read back through a pipe.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "parallel/comm_watchdog.h"

namespace shardlm {
namespace {

struct Child {
  int code = -1;
  std::string err;
  double seconds = 0;
};

// Runs body in a child process; the child exits 0 if body returns.
template <typename Body>
Child run_child(Body body) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    body();
    std::fflush(stderr);
    _exit(0);
  }
  close(fds[1]);
  Child c;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) c.err.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  c.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

std::string describe(const char* op) { return std::string(op) + " on group test timed out; peers: world rank 1"; }

TEST(CommWatchdog, StuckCallEndsTheProcessWithTheMessage) {
  const Child c = run_child([] {
    CommWatchdog w(0.3, describe);
    CommWatchdog::Busy busy(w, "all_reduce");
    std::this_thread::sleep_for(std::chrono::seconds(10));  // stuck: never checks a deadline
  });
  EXPECT_NE(c.code, 0) << c.err;
  EXPECT_LT(c.seconds, 5.0);
  EXPECT_NE(c.err.find("error: all_reduce on group test timed out; peers: world rank 1"), std::string::npos) << c.err;
}

TEST(CommWatchdog, CallsThatReturnInTimeEndNothing) {
  const Child c = run_child([] {
    CommWatchdog w(0.3, describe);
    for (int i = 0; i < 8; ++i) {  // 8 x 0.1 s marked, each released in time: 0.8 s in all
      CommWatchdog::Busy busy(w, "send");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // idle past the limit
  });
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.err, "");
}

TEST(CommWatchdog, NoLimitWatchesNothing) {
  const Child c = run_child([] {
    CommWatchdog w(0, describe);
    CommWatchdog::Busy busy(w, "barrier");
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  });
  EXPECT_EQ(c.code, 0) << c.err;
}

TEST(CommWatchdog, InnerMarkKeepsTheOuterCall) {
  const Child c = run_child([] {
    CommWatchdog w(0.3, describe);
    CommWatchdog::Busy outer(w, "broadcast");
    CommWatchdog::Busy inner(w, "send");
    std::this_thread::sleep_for(std::chrono::seconds(10));
  });
  EXPECT_NE(c.code, 0) << c.err;
  EXPECT_NE(c.err.find("error: broadcast on group test"), std::string::npos) << c.err;
}

TEST(CommWatchdog, LimitIsTwiceTheDeadlineAndAtLeastTwoSecondsMore) {
  EXPECT_EQ(CommWatchdog::limit_for(0), 0);
  EXPECT_EQ(CommWatchdog::limit_for(1), 3);
  EXPECT_EQ(CommWatchdog::limit_for(3), 6);
  EXPECT_EQ(CommWatchdog::limit_for(300), 600);
}

}  // namespace
}  // namespace shardlm
