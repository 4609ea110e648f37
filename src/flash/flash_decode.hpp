// The decode path of fast flash attention: problems whose query rows per kv head fit one small tile
// (G*T <= kDecodeMaxRows: one or a few new tokens against a long KV cache). Such a problem reads every
// K/V byte once and does ~G FLOPs per byte, so it is bound by the DRAM stream; this path reads K and V
// rows straight from their source in address order (no packed copy) through the kernel set's decode
// kernels (kernels/microkernels.hpp). flash_attention dispatches here when it applies.
#pragma once

#include "core/key_sums.hpp"
#include "core/problem.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {

// Whether the decode path takes p on kernel set k: k has decode kernels and G*T <= kDecodeMaxRows.
bool flash_decode_applies(const Problem& p, const FlashKernels& k);

// Attention for p on k's decode kernels (flash_decode_applies(p, k) must hold). Results depend on the
// shapes and block size only, never on the thread count.
void flash_attention_decode(const Problem& p, const FlashKernels& k);

// The number of KV splits per (b, kv head) the decode plan uses (1 = none). For tests.
int flash_decode_kv_splits(const Problem& p, const FlashKernels& k);

// How the decode path sums over keys (TaskPlan::key_sums of its plan).
KeySums flash_decode_key_sums(const Problem& p, const FlashKernels& k);

}  // namespace flashgqa
