// Internal: how the ranks of a group arrive at its store and find out that
// exactly the expected ranks came (rendezvous.cc makes the store).
//
// Note [Arrival protocol]
// The keys live under the group's prefix on its store ("ddp/<group>/<n>/",
// see group_prefix in rendezvous.cc). Each rank, in order:
//  1. (TCP stores) bounds the store's reads by a wait(), so that a port
//     whose owner accepts but never answers fails in time, not never.
//  2. Records its world size under "world_size" by compare-and-set: the
//     first rank's value stays; a rank given another fails naming both
//     values (else the job would end after the whole timeout in a Gloo
//     socket error). A store without compare-and-set skips this check.
//  3. Adds 1 to "rank/<r>": a second claimant of r gets 2, counts itself
//     under "duplicates" and fails ("two processes claim rank r").
//  4. Adds 1 to "arrived", then polls (1 ms doubling to 50 ms) until
//     "arrived" reaches the world size, an "error" appears, or its
//     deadline passes: then it fails naming the ranks whose "rank/<r>" is
//     missing. Meanwhile it names them in a warning every report_every.
// A rank that fails publishes the message under "error", its first byte
// the kind ('I' InvalidArgument, 'T' TimeoutError), so that every rank
// fails at once with the same message instead of waiting out its own
// timeout. Each rank that fails bumps "error_seen"; the rank hosting a TCP
// store keeps it up until every rank that took part has seen the error (at
// most 5 s), or the others would only see a lost connection.
// A rank 0 that cannot host the TCP store because its port is busy looks
// at the store there (claim_rank0_on_busy_port): a rendezvous of this group
// with rank 0 registered and ranks missing means a second rank 0, which
// step 3 then reports to everyone.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <string>

namespace ddp::detail {

// One rank's arrival on the group's (prefixed) store.
struct Arrival {
  c10d::Store& store;
  int rank = 0;
  int size = 1;
  const std::string& address;  // for messages
  std::chrono::milliseconds timeout;
  bool hosts_store = false;  // this rank hosts the TCP store (lingers)
  bool tcp = false;          // a c10d TCPStore (step 1)
  // Every report_every of waiting in step 4, a warning names the ranks
  // still missing (the stall warning's interval); 0: silent.
  std::chrono::milliseconds report_every{0};
};

// Runs Note [Arrival protocol] for `a`; returns once all a.size ranks have
// arrived. Throws InvalidArgument (world size mismatch, duplicate rank),
// TimeoutError (ranks missing at the deadline, or a store that never
// answers) or CommError (the store failed, e.g. its host exited).
void check_arrivals(const Arrival& a);

// Rank 0 could not host the store on a busy port. When a store there runs
// this group's rendezvous (`prefix`) with rank 0 registered and ranks
// still missing, this is a second rank 0: reports that to everyone and
// throws InvalidArgument. Otherwise returns, and the caller reports the
// busy port.
void claim_rank0_on_busy_port(const std::string& host, int port,
                              const std::string& prefix, int size,
                              const std::string& address,
                              std::chrono::milliseconds timeout);

// For messages: a duration in seconds, a count of ranks ("1 rank", "2
// ranks"), and c10d's message without its final period, to go inside ours.
double seconds(std::chrono::milliseconds d);
std::string ranks_text(int64_t n);
std::string inner_message(const std::exception& e);

}  // namespace ddp::detail
