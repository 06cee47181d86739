// ddp-train's answer to Ctrl-C and SIGTERM: stop at a step all ranks agree
// on, with a checkpoint to continue from.
//
// Note [Interrupted training]
// ddprun (torchrun, a terminal, a batch system) signals every rank, but
// not at the same step, and a rank that stopped on its own would leave the
// others waiting in the next gradient all_reduce. So the handler only
// records the signal; every kAgreeEvery steps, and after each epoch's
// checkpoint, the ranks all_reduce (MAX) what they got: once one rank has a
// signal, all stop after the same step. Training inside an epoch then saves
// the partial epoch as --max-steps does (the checkpoint's epoch_samples
// says where to go on), rank 0 says where it stopped and how to continue,
// draws metrics.png, and the process exits 128 + the signal, as a process
// ended by it would. The agreement and the save take well under ddprun's
// grace period (--grace-period, 5 s). A second signal ends the process at
// once (the handler is reset after the first: the default action).
#pragma once

#include <cstdint>

namespace ddp::train {

// Steps between two agreements.
inline constexpr int64_t kAgreeEvery = 5;

// Installs the handlers of SIGINT and SIGTERM (once per process).
void install_interrupt_handlers();

// Collective over the default group: the highest signal any rank has
// received so far (0: none). Every rank calls it at the same step.
int agreed_interrupt();

// "SIGINT", "SIGTERM", or "signal N".
const char* interrupt_name(int sig);

}  // namespace ddp::train
