// Internal: turns InitOptions into a store that every rank of the group
// shares (the init methods: env://, tcp://, file://, memory://, torchrun's
// agent store, ddprun's rendezvous file; rendezvous.cc), and checks that
// exactly the expected ranks arrived (Note [Arrival protocol],
// rendezvous_arrival.h).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

#include "ddp/env.h"
#include "ddp/process_group.h"

namespace ddp::detail {

// What the rendezvous takes from outside InitOptions, read once by
// new_process_group (ddp_env.h, ddp/env.h).
struct RendezvousInputs {
  // How often a waiting rank says so (the stall warning's interval; 0: silent).
  std::chrono::milliseconds report_every{0};
  std::string gloo_socket_ifname;  // DdpEnv::gloo_socket_ifname
  std::string local_addr;          // DdpEnv::local_addr
  std::string rendezvous_file;     // DdpEnv::rendezvous_file
  LaunchEnv launch;                // env://'s rank, size, master, agent store
};

struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;  // prefixed for this group
  int rank = 0;
  int size = 1;
  std::string address;       // for messages: "127.0.0.1:29500", a path, ...
  std::string gloo_address;  // see InitOptions::gloo_address; "" = default
  // A second connection to the same store with a short timeout, for the
  // stall inspector's background thread (Note [Progress publication]);
  // null: use `store`.
  c10::intrusive_ptr<c10d::Store> publish_store;
  // TCP stores: where the store is and the prefix above the group's
  // (torchrun's "/worker/attempt_N"), to open publish_store.
  std::string tcp_host;
  int tcp_port = 0;
  std::string tcp_prefix;
  // Input, from RendezvousInputs: how often a waiting rank says so.
  std::chrono::milliseconds report_every{0};
};

// Parses options.init_method, creates or connects to the store, and waits
// until options' world size of distinct ranks have arrived (see
// process_group.h for the errors). A rank that waits (for the store's host,
// or for the ranks missing) says so in a warning every
// `inputs.report_every`, naming whom it waits for.
Rendezvous rendezvous(const InitOptions& options, const RendezvousInputs& inputs);

// The local IP address whose route reaches `host` (the address other
// machines can reach this one on); "127.0.0.1" for a loopback host. Throws
// InvalidArgument naming the host when it does not resolve.
std::string local_address_towards(const std::string& host);

}  // namespace ddp::detail
