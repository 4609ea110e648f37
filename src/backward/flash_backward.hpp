// The backward pass (FlashAttention-2's), on the micro-kernels of the forward (kernels/microkernels.hpp).
// Math and operand rounding: core/backward_problem.hpp.
#pragma once

#include "core/backward_problem.hpp"
#include "kernels/cpu_features.hpp"

namespace flashgqa {

// Writes p.dq, p.dk, p.dv on instruction set `isa` (throws Error when unsupported). The bits do not
// depend on the thread count.
void flash_backward(const BackwardProblem& p, Isa isa);

}  // namespace flashgqa
