// A small HTTP client for the serving tests and `strata-bench serve`: one
// request per connection, answers de-chunked as they arrive, server-sent
// events handed over one by one (and the connection dropped when the caller
// says so). Needs nlohmann-json.
#pragma once

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "raw_socket.h"

namespace strata::testing {

using Json = nlohmann::json;

struct HttpResult {
  int status = 0;  // 0: no answer
  std::string head;
  std::string body;
  std::vector<Json> events;   // parsed "data: {...}" events ("[DONE]" as the string)
  bool disconnected = false;  // the caller hung up mid-answer
};

// A blocking connection to host:port whose reads give up after
// `recv_timeout_s`; -1 on failure.
inline int ConnectTo(const std::string& host, int port, int recv_timeout_s) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    timeval timeout{.tv_sec = recv_timeout_s, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

// `on_event` returns false to hang up.
inline HttpResult Exchange(const std::string& host, int port, const std::string& method,
                           const std::string& path, const std::string& body,
                           const std::function<bool(const Json&)>& on_event = nullptr,
                           int recv_timeout_s = 300) {
  HttpResult r;
  const int fd = ConnectTo(host, port, recv_timeout_s);
  if (fd < 0) return r;
  const std::string request = method + " " + path + " HTTP/1.1\r\nHost: test\r\nContent-Type: " +
                              "application/json\r\nContent-Length: " + std::to_string(body.size()) +
                              "\r\nConnection: close\r\n\r\n" + body;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return r;
  }
  std::string in;
  bool chunked = false;
  size_t events_at = 0;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) {
    in.append(buf, static_cast<size_t>(n));
    if (r.head.empty()) {
      const size_t end = in.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      r.head = in.substr(0, end);
      in.erase(0, end + 4);
      r.status = std::stoi(r.head.substr(9, 3));
      chunked = r.head.find("Transfer-Encoding: chunked") != std::string::npos;
    }
    if (chunked) {  // move whole chunks from `in` to the body
      for (;;) {
        const size_t eol = in.find("\r\n");
        if (eol == std::string::npos) break;
        const size_t size = std::stoul(in.substr(0, eol), nullptr, 16);
        if (in.size() < eol + 2 + size + 2) break;
        r.body += in.substr(eol + 2, size);
        in.erase(0, eol + 2 + size + 2);
      }
    } else {
      r.body += in;
      in.clear();
    }
    for (size_t end; (end = r.body.find("\n\n", events_at)) != std::string::npos;) {
      const std::string event = r.body.substr(events_at, end - events_at);
      events_at = end + 2;
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string data = event.substr(6);
      r.events.push_back(data == "[DONE]" ? Json(data) : Json::parse(data));
      if (on_event && !on_event(r.events.back())) {
        r.disconnected = true;
        close(fd);
        return r;
      }
    }
  }
  close(fd);
  return r;
}

// On 127.0.0.1.
inline HttpResult Exchange(int port, const std::string& method, const std::string& path,
                           const std::string& body,
                           const std::function<bool(const Json&)>& on_event = nullptr) {
  return Exchange("127.0.0.1", port, method, path, body, on_event);
}

inline HttpResult Post(int port, const Json& body,
                       const std::function<bool(const Json&)>& on_event = nullptr) {
  return Exchange(port, "POST", "/v1/completions", body.dump(), on_event);
}

inline HttpResult Get(int port, const std::string& path) { return Exchange(port, "GET", path, ""); }

// A Prometheus sample's value (the first series whose line starts with
// `series`), -1 when absent.
inline double MetricValue(const std::string& text, const std::string& series) {
  for (size_t at = text.find(series); at != std::string::npos; at = text.find(series, at + 1)) {
    if (at > 0 && text[at - 1] != '\n') continue;
    const size_t space = text.find(' ', at + series.size());
    if (space == std::string::npos) return -1;
    if (space != at + series.size()) continue;
    return std::stod(text.substr(space + 1));
  }
  return -1;
}

}  // namespace strata::testing
