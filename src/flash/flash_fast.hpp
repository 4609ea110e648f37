// The fast flash attention path: packed operands, register-tile micro-kernels chosen at run time
// (src/kernels), the online softmax fused per tile, tasks over (b, kv head, q block [, KV split]).
// Same function as every other algorithm (see flashgqa.hpp); only faster.
#pragma once

#include "core/problem.hpp"
#include "kernels/cpu_features.hpp"

namespace flashgqa {

// Attention on the active instruction set (active_isa()).
void flash_attention_fast(const Problem& p);
// The same on a chosen one (tests and benchmarks); throws Error when unsupported.
void flash_attention_fast(const Problem& p, Isa isa);

// The number of KV splits the plan uses for a problem (1 = none): a function of the shapes and block
// sizes only, never of the thread count, so results do not depend on the thread count. For tests.
int flash_max_kv_splits(const Problem& p, Isa isa);

}  // namespace flashgqa
