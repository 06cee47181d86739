// Randomness for data augmentation that is reproducible, and different on
// every rank, every epoch and every batch.
//
// PyTorch's recipe seeds each DataLoader worker from (base seed, worker id)
// in worker_init_fn, and programs add the rank and the epoch by hand; the
// results then change with the number of workers, because which worker
// makes which batch depends on it. ddp seeds per batch instead:
// data_generator(seed, epoch, rank, batch) gives the same random numbers to
// batch k of rank r in epoch e whatever the number of loader threads and
// however they are scheduled, different numbers to every other (rank,
// epoch, batch), and the same ones again in a resumed run.
// BatchLoader hands such a generator to a fetch function that takes one
// (batch_loader.h).
//
// Thread safety: plain functions; each call returns a new generator.
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>

namespace ddp {
namespace datasets {

// A 64-bit seed mixed from the four values (SplitMix64's finaliser over
// each in turn): changing any of them changes the seed unpredictably.
// `rank` -1 means this process's rank in the default process group (0 when
// there is none).
uint64_t data_seed(uint64_t seed, int64_t epoch, int rank, int64_t stream);

// A CPU generator (at::CPUGeneratorImpl, Mersenne Twister as
// torch::manual_seed's) seeded with data_seed(...). Pass it to random ops:
// at::rand({n}, generator), at::randperm(n, generator), bernoulli_, ...
at::Generator data_generator(uint64_t seed, int64_t epoch, int rank, int64_t stream);

}  // namespace datasets
}  // namespace ddp
