// Ports and sockets: the master-port check made before workers start, free
// ports for --standalone, and the TCP connections of the launchers' own
// rendezvous (control.h).
//
// Why the check binds with SO_REUSEADDR on every interface: that is how
// c10d's TCPStore binds its port, so a port this check accepts is one the
// store can bind (connections of a previous run in TIME_WAIT do not count;
// another listener does).
//
// Thread safety: plain functions.
#pragma once

#include <string>

namespace ddp::launcher {

// Empty when TCP `port` can be bound on every interface, else why not
// (strerror text, like "Address already in use").
std::string port_unavailable_reason(int port);

// Throws ddp::InvalidArgument naming --master-port and the port when
// port_unavailable_reason() says it cannot be bound, with a way out.
void check_master_port(int port);

// A TCP port that is free on every interface right now (the kernel's
// choice). Throws ddp::Error when no socket can be bound.
int pick_free_port();

// A listening socket (non-blocking, close-on-exec, SO_REUSEADDR) on `port`
// of every interface. Throws ddp::InvalidArgument naming --master-port and
// the port when it is taken.
int listen_on(int port);

// Like listen_on, but -1 when another socket listens on `port` (the c10d
// rendezvous: another launcher on this host hosts it). Other failures throw.
int try_listen_on(int port);

// Whether `host` (a name or an address) is one of this machine's addresses,
// loopback included: one of its resolved addresses can be bound. torchrun's
// c10d rendezvous hosts the store on such a node (its is_host test).
bool is_local_host(const std::string& host);

// Connects to host:port within timeout_ms. Returns a connected non-blocking
// close-on-exec socket with TCP_NODELAY, or -1 with `error` set to the
// reason (refused, unreachable, timed out, unknown host).
int connect_to(const std::string& host, int port, int timeout_ms,
               std::string& error);

}  // namespace ddp::launcher
