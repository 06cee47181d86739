// libtorch version differences in the autograd and optimizer internals ddp
// touches. Written with decltype rather than version tests, so that every
// libtorch between 1.13 and 2.13 gets the type its headers declare.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace ddp::compat {

// Owning pointer to an autograd Node: std::shared_ptr in 1.13,
// c10::intrusive_ptr in 2.13 (what impl::grad_accumulator returns).
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(
    std::declval<const torch::autograd::Variable&>()));

// The key of Optimizer::state() for a parameter: the TensorImpl's address
// as text in 1.13 (c10::guts::to_string of the pointer, i.e. operator<<),
// the address itself (void*) in 2.13.
using OptimizerStateKey = typename std::decay_t<
    decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

namespace detail {
template <class Key>
Key optimizer_state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}
}  // namespace detail

inline OptimizerStateKey optimizer_state_key(const at::Tensor& p) {
  return detail::optimizer_state_key<OptimizerStateKey>(p);
}

// Whether Optimizer::zero_grad takes set_to_none (2.x, default true: the
// gradient becomes undefined) or not (1.13: a defined gradient is zeroed).
template <class O, class = void>
struct zero_grad_sets_to_none : std::false_type {};
template <class O>
struct zero_grad_sets_to_none<O, std::void_t<decltype(std::declval<O&>().zero_grad(true))>>
    : std::true_type {};

// What this libtorch's default Optimizer::zero_grad() does to `grad`.
inline void clear_grad_as_zero_grad(at::Tensor& grad) {
  if constexpr (zero_grad_sets_to_none<torch::optim::Optimizer>::value) {
    grad = at::Tensor();
  } else if (grad.defined()) {
    grad = grad.detach();
    grad.zero_();
  }
}

}  // namespace ddp::compat
