// The seed's ladder, one named algorithm per file. Each takes a validated Problem (see
// core/problem.hpp) and writes p.out (and p.lse when set).
#pragma once

#include "core/key_sums.hpp"
#include "core/problem.hpp"

namespace flashgqa {

void naive_attention(const Problem& p);             // naive.cpp
void chunked_unstable_attention(const Problem& p);  // chunked_unstable.cpp
void chunked_attention(const Problem& p);           // chunked.cpp
void kernel1_attention(const Problem& p);           // kernel1.cpp
void flash_attention(const Problem& p);             // flash.cpp
void linear_attention_chunked(const Problem& p);    // linear_attention.cpp

// The rung `algorithm` on p (ladder.cpp): the one dispatch the API and the tests share. A workspace
// larger than the machine's memory is refused first (check_rung_workspace: Error).
void run_algorithm(const Problem& p, Algorithm algorithm);
double rung_workspace_bytes(const Problem& p, Algorithm algorithm);
void check_rung_workspace(const Problem& p, Algorithm algorithm);

// How the rung `algorithm` sums over keys on p, for the error bounds (core/key_sums.hpp,
// reference/tolerance.hpp), and the same for linear_attention_chunked.
KeySums key_sums(const Problem& p, Algorithm algorithm);
KeySums linear_key_sums(const Problem& p);

// Default KV chunk of the chunked rungs and kernel1: the seed's bkv.
inline constexpr std::int64_t kSeedBlockKV = 1024;
// Default q block of kernel1.
inline constexpr std::int64_t kKernel1BlockQ = 256;

}  // namespace flashgqa
