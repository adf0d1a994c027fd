// The accepting side of the HTTP server: one thread polls the listening socket and every
// connection whose request has not fully arrived, so that slow or idle clients hold no worker.
//
// A connection is only peeked at (MSG_PEEK, with SO_RCVLOWAT so poll wakes when enough bytes
// wait): when its headers and Content-Length body are all in the socket's receive buffer, the
// socket is handed to `serve` (a worker), which reads the request without waiting. Deadlines:
// the headers within header_timeout_ms of the accept, the body within body_timeout_ms of the
// headers. Limits: max_connections in all (waiting and being served), max_per_address from one
// peer address; over a limit the connection gets a 503 and is closed. A body larger than
// peek_bytes, a chunked one, or one sent after `Expect: 100-continue`, is handed over once the
// headers and what fits in peek_bytes have arrived (the worker then reads the rest under
// httplib's read timeout).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "vm/status.h"

namespace blue::server {

struct FrontOptions {
    std::string host = "127.0.0.1";
    int port = 0;  // 0: any free port
    int header_timeout_ms = 10000;
    int body_timeout_ms = 30000;
    uint32_t max_connections = 1024;
    uint32_t max_per_address = 256;
    size_t peek_bytes = 256u << 10;
    size_t max_header_bytes = 64u << 10;
};

// Connections the front closed before a worker saw them, by reason.
struct FrontCounts {
    std::atomic<uint64_t> accepted{0};
    std::atomic<uint64_t> dropped_timeout{0};        // headers or body not complete in time
    std::atomic<uint64_t> dropped_limit{0};          // over max_connections or max_per_address
    std::atomic<uint64_t> dropped_header_size{0};    // headers longer than max_header_bytes
    std::atomic<uint64_t> closed_early{0};           // the client closed before its request was whole
    std::atomic<uint64_t> waiting{0};                // connections being read now (gauge)
};

class ConnFront {
public:
    // `serve(fd, done)` owns fd (a blocking socket with a whole request waiting) and must call
    // done() once it has closed it; it should return quickly (queue the work).
    using Serve = std::function<void(int fd, std::function<void()> done)>;
    ConnFront(FrontOptions options, Serve serve);
    ~ConnFront();
    ConnFront(const ConnFront&) = delete;
    ConnFront& operator=(const ConnFront&) = delete;

    // Creates the listening socket; fails naming the address.
    Status bind();
    int port() const { return port_; }
    int listenSocket() const { return listen_fd_; }
    // Polls until stop(); closes the connections still waiting.
    void run();
    void stop();
    const FrontCounts& counts() const { return counts_; }

private:
    struct Conn;
    bool admit(const std::string& address);
    void release(const std::string& address);
    // Peeks at a readable connection: true while it stays waiting (deadline and low-water mark
    // updated), false once it was handed over or dropped. `peer_done`: the peer closed its side.
    bool examine(Conn& c, bool peer_done);

    FrontOptions options_;
    Serve serve_;
    int listen_fd_ = -1, port_ = 0;
    int wake_[2] = {-1, -1};
    std::atomic<bool> stopping_{false};
    FrontCounts counts_;
    std::mutex mutex_;
    uint32_t open_ = 0;                          // connections admitted and not yet closed
    std::map<std::string, uint32_t> per_address_;  // open connections by peer address
    std::string peek_;                           // scratch for MSG_PEEK
};

}  // namespace blue::server
