// Rung 5, flash attention (the seed's flash_attention): the KV loop moves inside the task. Each task
// owns one q block (block_q queries × all G heads of one kv head) and walks every KV block with its
// accumulators (o, denom, m) in a thread-local tile that never goes back to memory; the output is
// written once, in the output dtype. Tasks over (b, kv head, q block) are spread over threads; KV
// blocks past the causal diagonal of the block's last query are skipped. Per KV block a task moves
// 2·block_kv·H operand values and does 4·G·block_q·block_kv·H FLOPs: intensity grows with G·block_q.
//
// The rung is implemented once, by the fast path in src/flash/flash_packed.cpp: operands packed into the
// layouts of the per-ISA micro-kernels (src/kernels), the softmax fused per register tile, the
// instruction set chosen at run time (the portable kernels are its Isa::portable path).
#include "flash/flash_packed.hpp"
#include "ladder/ladder.hpp"

namespace flashgqa {

void flash_attention(const Problem& p) { flash_attention(p, active_isa()); }

}  // namespace flashgqa
