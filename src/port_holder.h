// Who holds a TCP port: for the messages that say a port is in use (the
// library's rendezvous store, ddprun's --master-port check). Linux only,
// libtorch-free; compiled into both libddp and ddp_launcher.
#pragma once

#include <string>

namespace ddp::detail {

// "pid 1234 (python3)" for the process listening on TCP `port` (IPv4 or
// IPv6, any address), from /proc/net/tcp{,6} and /proc/PID/fd; "" when it
// cannot be told (no listener, or the holder is another user's process,
// whose file descriptors this one cannot read). Never throws. Scans every
// process's descriptors: for error messages only.
std::string port_holder(int port);

}  // namespace ddp::detail
