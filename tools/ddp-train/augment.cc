#include "augment.h"

#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/where.h>

#include <vector>

#include "ddp/error.h"

namespace ddp::train {
namespace {

constexpr int64_t kShift = 2;

at::Tensor flip(const at::Tensor& x, at::Generator& g) {
  const int64_t n = x.size(0);
  at::Tensor mirrored = at::rand({n}, g).lt(0.5).view({n, 1, 1, 1});
  return at::where(mirrored, at::flip(x, {3}), x);
}

// Pads with the background (the smallest value: a 0 pixel, normalized) and
// cuts each image's window at its own offset.
at::Tensor shift(const at::Tensor& x, at::Generator& g) {
  const int64_t n = x.size(0), h = x.size(2), w = x.size(3);
  const double background = x.numel() > 0 ? x.min().item<double>() : 0.0;
  at::Tensor padded = at::constant_pad_nd(x, {kShift, kShift, kShift, kShift}, background);
  at::Tensor offsets = at::randint(0, 2 * kShift + 1, {n, 2}, g, at::kLong);
  const int64_t* o = offsets.data_ptr<int64_t>();
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(padded[i].narrow(1, o[2 * i], h).narrow(2, o[2 * i + 1], w));
  }
  return at::stack(out);
}

}  // namespace

at::Tensor augment(const at::Tensor& images, const std::string& kind, at::Generator& generator) {
  if (kind == "none") return images;
  if (kind == "flip") return flip(images, generator);
  if (kind == "flip-shift") return shift(flip(images, generator), generator);
  throw InvalidArgument("ddp-train: --augment " + kind + ": expected none, flip or flip-shift");
}

}  // namespace ddp::train
