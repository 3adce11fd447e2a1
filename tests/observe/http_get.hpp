// For the metrics tests: a loopback HTTP/1.0 GET, and the text exposition
// parsed into "name{labels}" -> value.
#pragma once

#include <cmath>
#include <map>
#include <sstream>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace u3m::observe::testing {

// The body, or "" if the server cannot be reached or does not answer 200.
inline std::string http_get(int port, const std::string& path = "/metrics") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, n);
    }
  }
  ::close(fd);
  if (out.rfind("HTTP/1.1 200", 0) != 0 && out.rfind("HTTP/1.0 200", 0) != 0) return "";
  const auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

// A port nobody listens on now (bound to 0, then released): for a CLI test
// that must name its port up front.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

inline std::map<std::string, double> parse_exposition(const std::string& text) {
  std::map<std::string, double> m;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    const std::string v = line.substr(sp + 1);
    m[line.substr(0, sp)] = v == "+Inf" ? INFINITY : std::strtod(v.c_str(), nullptr);
  }
  return m;
}

}  // namespace u3m::observe::testing
