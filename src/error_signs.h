// Internal: the words by which an error says that it follows another
// rank's failure, so that ddprun names the rank that failed first (Note
// [Root cause] in launcher/summary.h). error_file.cc looks for them in the
// message it writes to TORCHELASTIC_ERROR_FILE and says which kind of
// consequence it is (extraInfo.ddp_lost_peer, extraInfo.ddp_consequence).
#pragma once

namespace ddp::detail {

// A connection or a co-located peer was lost: the texts of work.cc and
// shm/shm_protocol.cc.
inline constexpr const char* kLostPeerSigns[] = {
    "a peer rank closed its connection", "because another rank failed first",
    "exited while this collective was running"};

// A collective call that fails on every rank when one rank fails (the
// checkpoint calls) says so on the ranks that only report that rank's error.
inline constexpr const char* kReportedByAnotherRank = "reported by that rank";

}  // namespace ddp::detail
