// Builds flight-recorder rings (src/flight/flight_format.h) in memory, for
// the flight_trace fuzzer's seeds and its input layout. No libtorch.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "flight/flight_format.h"

namespace ddp::fuzz {

// One rank's ring of `capacity` entries with the first `n` collectives
// (seq 1..n) written, the last one left in `last_state`.
inline std::string make_ring(int rank, int world_size, uint32_t capacity, uint64_t n,
                             flight::State last_state, const char* reason = "") {
  std::string bytes(flight::ring_bytes(capacity), '\0');
  auto* h = reinterpret_cast<flight::Header*>(bytes.data());
  std::memcpy(h->magic, flight::kMagic, sizeof(flight::kMagic));
  h->version = flight::kVersion;
  h->header_size = sizeof(flight::Header);
  h->entry_size = sizeof(flight::Entry);
  h->capacity = capacity;
  h->rank = rank;
  h->world_size = world_size;
  h->local_rank = rank;
  h->pid = 1000 + rank;
  h->created_us = 1700000000000000;
  h->written.store(n);
  h->events.store(reason[0] != '\0' ? 1 : 0);
  h->event_us = reason[0] != '\0' ? 1700000000900000 : 0;
  std::strncpy(h->group, "default", sizeof(h->group) - 1);
  std::strncpy(h->backend, "gloo", sizeof(h->backend) - 1);
  std::strncpy(h->host, "host", sizeof(h->host) - 1);
  std::strncpy(h->reason, reason, sizeof(h->reason) - 1);
  auto* entries = reinterpret_cast<flight::Entry*>(bytes.data() + sizeof(flight::Header));
  for (uint64_t id = n > capacity ? n - capacity : 0; id < n; ++id) {
    flight::Entry& e = entries[id % capacity];
    e.guard.store(2);
    e.id = id;
    e.seq = id + 1;
    e.state = static_cast<uint32_t>(id + 1 == n ? last_state : flight::State::kCompleted);
    e.step = static_cast<int64_t>(id / 2);
    e.bucket = id % 2 == 0 ? 0 : -1;
    e.start_us = 1700000000000000 + static_cast<int64_t>(id) * 1000;
    e.end_us = e.state == static_cast<uint32_t>(flight::State::kStarted) ? 0 : e.start_us + 500;
    std::snprintf(e.op, sizeof(e.op), "all_reduce of gradient bucket 0 of 1 (iteration %d)",
                  static_cast<int>(e.step));
    std::snprintf(e.signature, sizeof(e.signature), "all_reduce SUM float32[%d]",
                  id % 2 == 0 ? 16 : 4);
  }
  return bytes;
}

}  // namespace ddp::fuzz
