// HttpServer: request bodies within bounds, answers made later on another
// thread, streamed answers, and a client that goes away (or never reads)
// while its answer is made.
#include "strata/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "raw_socket.h"

namespace strata {
namespace {

using testing::ConnectLoopback;
using testing::RawExchange;
using testing::ReadAll;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A connection to `port` that has sent `request`; -1 on failure.
int SendRequest(int port, const std::string& request) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return -1;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// Answers POST /echo with its body, at once.
std::unique_ptr<HttpServer> StartEcho(HttpServerOptions options = {}) {
  options.methods = {"GET", "POST"};
  if (options.max_body_bytes == 0) options.max_body_bytes = 1 << 20;
  auto server = HttpServer::Start(
      "127.0.0.1:0",
      [](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
        HttpReply r;
        r.body = request.method + " " + request.path + " " + request.body;
        responder->Reply(std::move(r));
      },
      options);
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(server).value() : nullptr;
}

TEST(HttpServerTest, ReadsABodyThatArrivesInPiecesAndKeepsTheConnection) {
  auto server = StartEcho();
  ASSERT_NE(server, nullptr);
  httplib::Client client("127.0.0.1", server->port());
  auto r = client.Post("/echo?x=1", std::string(100000, 'b'), "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /echo " + std::string(100000, 'b'));
  auto again = client.Get("/echo");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->body, "GET /echo ");

  const int fd = ConnectLoopback(server->port());
  ASSERT_GE(fd, 0);
  const std::string head = "POST /p HTTP/1.1\r\nContent-Length: 6\r\nConnection: close\r\n\r\nab";
  ASSERT_EQ(send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(send(fd, "cdef", 4, MSG_NOSIGNAL), 4);
  const std::string reply = ReadAll(fd);
  close(fd);
  EXPECT_NE(reply.find("POST /p abcdef"), std::string::npos) << reply;
}

TEST(HttpServerTest, RefusesBodiesPastTheLimitOrWithoutALengthBeforeReadingThem) {
  HttpServerOptions options;
  options.max_body_bytes = 10;
  options.json_errors = true;
  auto server = StartEcho(options);
  ASSERT_NE(server, nullptr);
  const std::string smuggled = "GET /smuggled HTTP/1.1\r\n\r\n";
  std::string reply = RawExchange(
      server->port(), "POST /e HTTP/1.1\r\nContent-Length: 11\r\n\r\n0123456789x" + smuggled);
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply;
  EXPECT_NE(reply.find("\"code\":413"), std::string::npos) << reply;
  EXPECT_EQ(Count(reply, "HTTP/1.1 "), 1u) << reply;
  reply = RawExchange(server->port(),
                      "POST /e HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled);
  EXPECT_EQ(reply.rfind("HTTP/1.1 411", 0), 0u) << reply;
  EXPECT_EQ(Count(reply, "HTTP/1.1 "), 1u) << reply;
  for (const char* length : {"-1", "1x", "", "99999999999999999999999"}) {
    reply = RawExchange(server->port(),
                        std::string("POST /e HTTP/1.1\r\nContent-Length: ") + length + "\r\n\r\n");
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << length << ": " << reply;
  }
  reply = RawExchange(server->port(),
                      "POST /e HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab");
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
  reply = RawExchange(server->port(), "PUT /e HTTP/1.1\r\n\r\n");
  EXPECT_EQ(reply.rfind("HTTP/1.1 405", 0), 0u) << reply;
  EXPECT_NE(reply.find("Allow: GET, POST"), std::string::npos) << reply;
  EXPECT_GE(server->stats().rejected, 8u);
}

TEST(HttpServerTest, ABodyThatStallsIsCutOffAtTheDeadline) {
  HttpServerOptions options;
  options.limits.head_timeout = std::chrono::nanoseconds(std::chrono::milliseconds(200)).count();
  auto server = StartEcho(options);
  ASSERT_NE(server, nullptr);
  const int fd = ConnectLoopback(server->port());
  ASSERT_GE(fd, 0);
  const std::string head = "POST /p HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc";
  ASSERT_EQ(send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  EXPECT_EQ(ReadAll(fd), "");  // closed, no answer
  close(fd);
  EXPECT_GE(server->stats().connections_dropped, 1u);
}

// A handler that keeps its responders for the test to answer.
struct Parked {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<HttpResponder>> responders;
  std::atomic<int> gone{0};

  HttpHandler Handler() {
    return [this](HttpRequest, std::shared_ptr<HttpResponder> responder) {
      responder->OnClientGone([this] { ++gone; });
      std::lock_guard lock(mu);
      responders.push_back(std::move(responder));
      cv.notify_all();
    };
  }
  std::shared_ptr<HttpResponder> Wait(size_t n) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return responders.size() >= n; });
    return responders.size() >= n ? responders[n - 1] : nullptr;
  }
};

std::unique_ptr<HttpServer> StartParked(Parked& parked, HttpServerOptions options = {}) {
  options.methods = {"GET", "POST"};
  options.max_body_bytes = 1024;
  auto server = HttpServer::Start("127.0.0.1:0", parked.Handler(), options);
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(server).value() : nullptr;
}

TEST(HttpServerTest, AnswersLaterFromAnotherThreadThenServesThePipelinedRequest) {
  Parked parked;
  auto server = StartParked(parked);
  ASSERT_NE(server, nullptr);
  const int fd = SendRequest(server->port(),
                             "GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\nConnection: close\r\n\r\n");
  ASSERT_GE(fd, 0);
  auto first = parked.Wait(1);
  ASSERT_NE(first, nullptr);
  std::thread([first] {
    HttpReply r;
    r.body = "one";
    first->Reply(r);
  }).join();
  auto second = parked.Wait(2);
  ASSERT_NE(second, nullptr);
  second.reset();  // dropped unanswered: the client gets a 500, not silence
  {
    std::lock_guard lock(parked.mu);
    parked.responders.clear();
  }
  const std::string reply = ReadAll(fd);
  close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_LT(reply.find("one"), reply.find("HTTP/1.1 500")) << reply;
  EXPECT_EQ(parked.gone.load(), 0);
}

TEST(HttpServerTest, StreamsChunksToHttp11AndRawBytesToHttp10) {
  Parked parked;
  auto server = StartParked(parked);
  ASSERT_NE(server, nullptr);
  std::thread streamer([&] {
    for (size_t n = 1; n <= 2; ++n) {
      auto r = parked.Wait(n);
      if (r == nullptr) return;
      r->StartStream(200, "text/event-stream");
      for (int i = 0; i < 5; ++i) EXPECT_TRUE(r->Send("data: " + std::to_string(i) + "\n\n"));
      r->End();
      EXPECT_FALSE(r->client_gone());
    }
  });
  httplib::Client client("127.0.0.1", server->port());
  auto r = client.Get("/s");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
  EXPECT_EQ(r->get_header_value("Transfer-Encoding"), "chunked");
  const std::string raw = RawExchange(server->port(), "GET /s HTTP/1.0\r\n\r\n");
  streamer.join();
  EXPECT_NE(raw.find("Connection: close"), std::string::npos) << raw;
  EXPECT_NE(raw.find("\r\n\r\ndata: 0\n\ndata: 1\n\n"), std::string::npos) << raw;
  EXPECT_EQ(parked.gone.load(), 0);
}

TEST(HttpServerTest, AClientThatLeavesMidStreamIsReportedOnceAndLaterPartsAreDropped) {
  Parked parked;
  auto server = StartParked(parked);
  ASSERT_NE(server, nullptr);
  const int fd = SendRequest(server->port(), "GET /s HTTP/1.1\r\n\r\n");
  ASSERT_GE(fd, 0);
  auto r = parked.Wait(1);
  ASSERT_NE(r, nullptr);
  r->StartStream(200, "text/event-stream");
  EXPECT_TRUE(r->Send("first"));
  char buf[256];
  EXPECT_GT(recv(fd, buf, sizeof(buf), 0), 0);
  close(fd);
  for (int i = 0; i < 500 && !r->client_gone(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(r->client_gone());
  EXPECT_FALSE(r->Send("second"));
  EXPECT_EQ(parked.gone.load(), 1);
  int late = 0;
  r->OnClientGone([&] { ++late; });  // already gone: called at once
  EXPECT_EQ(late, 1);
  r->End();
  EXPECT_EQ(parked.gone.load(), 1);
}

TEST(HttpServerTest, AClientThatNeverReadsItsStreamIsCutOffAndStopEndsPendingAnswers) {
  Parked parked;
  HttpServerOptions options;
  options.limits.write_timeout = std::chrono::nanoseconds(std::chrono::milliseconds(300)).count();
  auto server = StartParked(parked, options);
  ASSERT_NE(server, nullptr);
  const int reader = ConnectLoopback(server->port());
  ASSERT_GE(reader, 0);
  const int idle = ConnectLoopback(server->port());
  ASSERT_GE(idle, 0);
  const std::string get = "GET /s HTTP/1.1\r\n\r\n";
  ASSERT_EQ(send(reader, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  auto r = parked.Wait(1);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(send(idle, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  auto pending = parked.Wait(2);
  ASSERT_NE(pending, nullptr);
  r->StartStream(200, "application/octet-stream");
  const std::string part(64 << 10, 'x');
  bool cut = false;
  for (int i = 0; i < 2000 && !cut; ++i) {  // at most 128 MB offered
    cut = !r->Send(part);
    if (i % 16 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(cut);
  for (int i = 0; i < 500 && parked.gone.load() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(parked.gone.load(), 1);
  server->Stop();  // the other answer is still pending
  EXPECT_EQ(parked.gone.load(), 2);
  EXPECT_TRUE(pending->client_gone());
  pending->Reply(HttpReply());  // after the server: dropped, no crash
  close(reader);
  close(idle);
}

// A drain ends answers, then stops the server: what they sent last must
// still reach their clients.
TEST(HttpServerTest, StopRightAfterAnAnswerEndedStillDeliversIt) {
  Parked parked;
  auto server = StartParked(parked);
  ASSERT_NE(server, nullptr);
  const int fd = SendRequest(server->port(), "GET /s HTTP/1.1\r\n\r\n");
  ASSERT_GE(fd, 0);
  auto r = parked.Wait(1);
  ASSERT_NE(r, nullptr);
  r->StartStream(200, "text/event-stream");
  const std::string part(256 << 10, 'x');  // more than a socket buffer takes at once
  EXPECT_TRUE(r->Send(part));
  EXPECT_TRUE(r->Send("data: [DONE]\n\n"));
  r->End();
  server->Stop();
  const std::string reply = ReadAll(fd);
  close(fd);
  const std::string tail = "data: [DONE]\n\n\r\n0\r\n\r\n";  // the last chunk, then the end
  ASSERT_GT(reply.size(), part.size());
  EXPECT_EQ(reply.substr(reply.size() - tail.size()), tail);
  EXPECT_EQ(parked.gone.load(), 0);
}

}  // namespace
}  // namespace strata
