// Internal: how the terminate handler (error_file.cc, the ground floor)
// reaches the process groups without knowing them.
//
// Note [Last words]
// A rank can die of an error nothing can catch: Gloo checks a peer's
// message on its transport thread and terminates the process when it does
// not fit (the ranks are out of step). The others then see only a closed
// connection. So the dying rank leaves its message, best effort, in the
// store of every live group ("fatal/<rank>": CollectiveMonitor::
// publish_fatal), and a rank whose collective fails because a peer vanished
// reads it back (CollectiveMonitor::fatal_notes) and names the cause:
// "rank 1: the ranks are out of step ...". The terminate handler lives below
// the groups, so the groups register a publisher with it when the first one
// is created (process_group.cc); before that there is nothing to tell.
#pragma once

#include <string>

namespace ddp::detail {

// Publishes `message` to every live group. Must not throw, and must not
// block on a lock the dying thread may hold.
using LastWordsPublisher = void (*)(const std::string& message) noexcept;

// Installs the publisher (the last call wins; thread-safe).
void set_last_words_publisher(LastWordsPublisher publisher) noexcept;

// Calls the installed publisher, if any.
void publish_last_words(const std::string& message) noexcept;

}  // namespace ddp::detail
