#include "ddp/datasets/seeding.h"

#include <ATen/CPUGeneratorImpl.h>

#include "ddp/process_group.h"

namespace ddp {
namespace datasets {
namespace {

// SplitMix64's output function: a bijection on 64 bits with full avalanche.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t data_seed(uint64_t seed, int64_t epoch, int rank, int64_t stream) {
  if (rank < 0) rank = is_initialized() ? get_rank() : 0;
  uint64_t h = mix(seed);
  h = mix(h ^ static_cast<uint64_t>(epoch));
  h = mix(h ^ static_cast<uint64_t>(static_cast<int64_t>(rank)));
  return mix(h ^ static_cast<uint64_t>(stream));
}

at::Generator data_generator(uint64_t seed, int64_t epoch, int rank, int64_t stream) {
  return at::make_generator<at::CPUGeneratorImpl>(data_seed(seed, epoch, rank, stream));
}

}  // namespace datasets
}  // namespace ddp
