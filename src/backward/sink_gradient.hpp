// The gradient of the attention sinks (Options::sinks): each row's softmax denominator holds e^sink
// with no value, so dP_j/dsink = -P_j P_sink with P_sink = exp(sink - lse_t), and
//   dsink[k,g] = -sum_{b,t} P_sink[b,k,g,t] D[b,k,g,t],   D_t = sum_h dout[t,h] out[t,h]
// (D = sum_j P_j dP_j, read from the forward's out as the backward's D is). One pass over dout and out
// beside the backward's five matmuls: O(B K G T H) reads, no matmul.
#pragma once

#include "core/backward_problem.hpp"

namespace flashgqa {

// Writes p.dsinks[kh*G + g] (nothing when null). Each head is summed over (b, t) in that order, in
// double, by one thread: the bits do not depend on the thread count. A row that saw no key has out 0,
// so D = 0 and it adds nothing.
void sink_gradient(const BackwardProblem& p);

}  // namespace flashgqa
