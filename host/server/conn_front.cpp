// ConnFront (see conn_front.h): accept, peek until a request is whole, hand it to a worker.
#include "host/server/conn_front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace blue::server {

namespace {

using Clock = std::chrono::steady_clock;

std::string addressOf(const sockaddr_storage& a) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
    } else if (a.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
    }
    return buf;
}

void setLowWater(int fd, size_t bytes) {
    int v = int(std::max<size_t>(bytes, 1));
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
}

// The value of header `name` (lower case) in `head` (the request line and headers), or "".
std::string headerValue(const std::string& head, const char* name) {
    const size_t n = std::strlen(name);
    size_t at = head.find("\r\n");
    while (at != std::string::npos && at + 2 < head.size()) {
        const size_t start = at + 2;
        const size_t end = head.find("\r\n", start);
        const size_t stop = end == std::string::npos ? head.size() : end;
        if (stop - start > n && head[start + n] == ':') {
            bool same = true;
            for (size_t i = 0; i < n && same; ++i) same = std::tolower((unsigned char)head[start + i]) == name[i];
            if (same) {
                size_t v = start + n + 1;
                while (v < stop && (head[v] == ' ' || head[v] == '\t')) ++v;
                return head.substr(v, stop - v);
            }
        }
        at = end;
    }
    return "";
}

}  // namespace

struct ConnFront::Conn {
    int fd = -1;
    std::string address;
    Clock::time_point deadline;
    bool have_headers = false;
};

ConnFront::ConnFront(FrontOptions options, Serve serve) : options_(std::move(options)), serve_(std::move(serve)) {}

ConnFront::~ConnFront() {
    stop();
    if (listen_fd_ >= 0) close(listen_fd_);
    for (int fd : wake_) {
        if (fd >= 0) close(fd);
    }
}

Status ConnFront::bind() {
    addrinfo hints{}, *found = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    const std::string port = std::to_string(options_.port);
    if (getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &found) != 0 || !found) {
        return BLUE_ERROR("cannot resolve the address %s", options_.host.c_str());
    }
    for (addrinfo* a = found; a && listen_fd_ < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int yes = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
        if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
            listen_fd_ = fd;
        } else {
            close(fd);
        }
    }
    freeaddrinfo(found);
    if (listen_fd_ < 0) {
        return BLUE_ERROR("cannot listen on %s:%d (in use, or not an address of this machine)",
                          options_.host.c_str(), options_.port);
    }
    sockaddr_storage local{};
    socklen_t n = sizeof local;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&local), &n);
    port_ = local.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(local).sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in&>(local).sin_port);
    if (pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) return BLUE_ERROR("cannot create a pipe");
    return Status::ok();
}

bool ConnFront::admit(const std::string& address) {
    std::lock_guard<std::mutex> lock(mutex_);
    uint32_t& mine = per_address_[address];
    if (open_ >= options_.max_connections || mine >= options_.max_per_address) {
        if (mine == 0) per_address_.erase(address);
        return false;
    }
    ++open_;
    ++mine;
    return true;
}

void ConnFront::release(const std::string& address) {
    std::lock_guard<std::mutex> lock(mutex_);
    --open_;
    auto it = per_address_.find(address);
    if (it != per_address_.end() && --it->second == 0) per_address_.erase(it);
}

bool ConnFront::examine(Conn& c, bool peer_done) {
    peek_.resize(options_.peek_bytes);
    const ssize_t got = recv(c.fd, peek_.data(), peek_.size(), MSG_PEEK | MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    auto drop = [&](std::atomic<uint64_t>& counter) {
        ++counter;
        --counts_.waiting;
        close(c.fd);
        release(c.address);
        return false;
    };
    // A peer that closed (or shut down its side) before its request was whole never completes it.
    if (got <= 0) return drop(counts_.closed_early);
    const size_t n = size_t(got);
    const std::string_view seen(peek_.data(), n);
    const size_t head_end = seen.find("\r\n\r\n");
    if (head_end == std::string_view::npos) {
        if (n >= options_.max_header_bytes) return drop(counts_.dropped_header_size);
        if (peer_done) return drop(counts_.closed_early);
        setLowWater(c.fd, n + 1);
        return true;
    }
    const std::string head(seen.substr(0, head_end));
    if (!c.have_headers) {
        c.have_headers = true;
        c.deadline = Clock::now() + std::chrono::milliseconds(options_.body_timeout_ms);
    }
    // Content-Length as httplib will read it; a malformed one is httplib's to refuse.
    const std::string length_text = headerValue(head, "content-length");
    unsigned long long length = 0;
    if (!length_text.empty()) length = std::strtoull(length_text.c_str(), nullptr, 10);
    // A chunked body has no length to wait for, and a client that sends `Expect: 100-continue`
    // waits for httplib's 100 before its body: both go to a worker once the headers are in.
    const bool chunked = !headerValue(head, "transfer-encoding").empty() || !headerValue(head, "expect").empty();
    const size_t need = head_end + 4 + size_t(std::min<unsigned long long>(length, options_.peek_bytes));
    if (!chunked && n < need && need <= options_.peek_bytes) {
        if (peer_done) return drop(counts_.closed_early);
        setLowWater(c.fd, need);
        return true;
    }
    // Whole (or as much as a peek can show): the worker reads it.
    setLowWater(c.fd, 1);
    const int flags = fcntl(c.fd, F_GETFL);
    fcntl(c.fd, F_SETFL, flags & ~O_NONBLOCK);
    const std::string address = c.address;
    --counts_.waiting;
    serve_(c.fd, [this, address] { release(address); });
    return false;
}

void ConnFront::run() {
    std::vector<Conn> conns;
    std::vector<pollfd> fds;
    auto accept_after = Clock::now();  // out of descriptors: accepting pauses briefly
    while (!stopping_) {
        const auto now = Clock::now();
        // Drop the connections past their deadline; find the nearest deadline.
        auto next = now + std::chrono::seconds(1);
        size_t kept = 0;
        for (Conn& c : conns) {
            if (c.deadline <= now) {
                ++counts_.dropped_timeout;
                --counts_.waiting;
                close(c.fd);
                release(c.address);
                continue;
            }
            next = std::min(next, c.deadline);
            if (&conns[kept] != &c) conns[kept] = std::move(c);  // never a self-move: it empties strings
            ++kept;
        }
        conns.resize(kept);
        fds.clear();
        fds.push_back({listen_fd_, short(now >= accept_after ? POLLIN : 0), 0});
        if (now < accept_after) next = std::min(next, accept_after);
        fds.push_back({wake_[0], POLLIN, 0});
        for (const Conn& c : conns) fds.push_back({c.fd, short(POLLIN | POLLRDHUP), 0});
        const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
        if (poll(fds.data(), fds.size(), int(wait)) < 0) continue;
        if (stopping_) break;
        // Connections first (their indices match fds[2..]), then new ones.
        kept = 0;
        for (size_t i = 0; i < conns.size(); ++i) {
            const short ev = fds[i + 2].revents;
            if (ev && !examine(conns[i], (ev & (POLLRDHUP | POLLHUP | POLLERR)) != 0)) continue;
            if (kept != i) conns[kept] = std::move(conns[i]);
            ++kept;
        }
        conns.resize(kept);
        if (!(fds[0].revents & POLLIN)) continue;
        for (;;) {
            sockaddr_storage peer{};
            socklen_t len = sizeof peer;
            const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                // Out of descriptors: the rest wait in the backlog (polling would spin meanwhile).
                if (errno == EMFILE || errno == ENFILE) accept_after = Clock::now() + std::chrono::milliseconds(100);
                break;
            }
            ++counts_.accepted;
            Conn c;
            c.fd = fd;
            c.address = addressOf(peer);
            if (!admit(c.address)) {
                ++counts_.dropped_limit;
                static constexpr char kBusy[] =
                    "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
                (void)!send(fd, kBusy, sizeof kBusy - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
                close(fd);
                continue;
            }
            c.deadline = Clock::now() + std::chrono::milliseconds(options_.header_timeout_ms);
            conns.push_back(std::move(c));
            ++counts_.waiting;
        }
    }
    for (Conn& c : conns) {
        close(c.fd);
        release(c.address);
    }
    counts_.waiting = 0;
}

void ConnFront::stop() {
    stopping_ = true;
    if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
}

}  // namespace blue::server
