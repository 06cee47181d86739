// Test support: a model's parameters and buffers as named tensors, copied
// between models and compared with a tolerance.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace ddp::testing {

using NamedState = std::vector<std::pair<std::string, at::Tensor>>;

// Parameters, then buffers, by name, as detached clones.
template <typename Net>
NamedState state_of(const Net& m) {
  NamedState out;
  for (const auto& p : m->named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
  for (const auto& b : m->named_buffers()) out.emplace_back(b.key(), b.value().detach().clone());
  return out;
}

// Copies values (parameters + perturb, buffers as they are) and the
// parameters' requires_grad flags.
template <typename Net>
void copy_state(const Net& from, Net& to, double perturb = 0.0) {
  torch::NoGradGuard g;
  auto src = from->named_parameters();
  for (auto& p : to->named_parameters()) {
    p.value().copy_(src[p.key()] + perturb);
    p.value().set_requires_grad(src[p.key()].requires_grad());
  }
  auto bsrc = from->named_buffers();
  for (auto& b : to->named_buffers()) b.value().copy_(bsrc[b.key()]);
}

inline void expect_same_state(const NamedState& a, const NamedState& b, const std::string& what,
                              double atol = 1e-6) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first) << what;
    ASSERT_EQ(a[i].second.sizes(), b[i].second.sizes()) << what << ": " << a[i].first;
    double diff =
        (a[i].second.to(at::kDouble) - b[i].second.to(at::kDouble)).abs().max().item<double>();
    EXPECT_LE(diff, atol) << what << ": " << a[i].first << " differs by " << diff;
  }
}

// The largest absolute difference between two states of one model.
inline double max_diff(const NamedState& a, const NamedState& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, (a[i].second - b[i].second).abs().max().item<double>());
  }
  return d;
}

}  // namespace ddp::testing
