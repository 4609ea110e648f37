// The seed's roofline model: FLOPs, arithmetic intensity (FLOP per byte moved between main memory and
// the fast memory), the machine's balance point, and the predicted time max(t_math, t_comms) of each
// rung of the ladder. Bytes count bf16 operands (2 bytes) as the seed does, and fp32 carries as 4.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/problem.hpp"
#include "flashgqa/flashgqa.hpp"

namespace flashgqa::study {

struct Shape {
  std::int64_t B = 1, K = 1, G = 1, T = 1, S = 1, H = 1;
};
std::string to_string(const Shape& s);  // "B,K,G,T,S,H"

// What the machine allows (per second), measured by ceilings.hpp or given (the seed's TPU v6e).
struct Machine {
  double flops = 0;      // peak matmul FLOP/s (bf16 dot products)
  double bandwidth = 0;  // main-memory read bandwidth, bytes/s
};

// 4·B·K·G·H per visible (query, key) pair: two matmuls of 2·H per pair and query head. All T·S pairs
// without a mask; with causal masking at `causal_offset` (default S - T, bottom-right) the pairs
// Problem::visible_keys lets through, so T = 512, S = 8192 counts nearly all of them, T = S about half.
double attention_flops(const Shape& s, bool causal, std::optional<std::int64_t> causal_offset = std::nullopt);
// The same for a validated problem (its mask as it is).
double attention_flops(const Problem& p);

// The seed's intensity of either matmul of naive attention, per (b, kv head):
// G·T·H·S / (G·T·H + S·H + G·T·S). With G = 4, H = 128 and T = S it is 128·T / (160 + T) < 128.
double naive_intensity(const Shape& s);
// The seed's intensity of flash attention: G·T·S / (G·T + S) (q, k, v, o moved once).
double flash_intensity(const Shape& s);
// FLOP per byte of the chunked rungs: naive's traffic plus, per KV chunk of `block_kv`, the fp32
// numerator carry read and written and q read again.
double chunked_intensity(const Shape& s, std::int64_t block_kv);
// FLOP per byte of kernel1: q, k, v, o moved once, plus per KV block the carries (o, denom, m) in
// fp32 read and written and q read again; the logits stay in the tile.
double kernel1_intensity(const Shape& s, std::int64_t block_kv);
// The intensity of `algorithm` at the shape (block_kv: the rung's KV block).
double intensity(Algorithm algorithm, const Shape& s, std::int64_t block_kv);

// Balance point: FLOP per byte at which t_math = t_comms.
inline double balance(const Machine& m) { return m.flops / m.bandwidth; }

struct Prediction {
  double t_math = 0;   // flops / peak
  double t_comms = 0;  // flops / intensity / bandwidth
  double time() const { return t_math > t_comms ? t_math : t_comms; }
  bool compute_bound() const { return t_math >= t_comms; }
};
Prediction predict(double flops, double intensity, const Machine& m);

// Smallest L such that flash at T = S = L is compute-bound: G·L/(G + 1) >= balance.
double flash_compute_bound_length(std::int64_t G, double balance);
// The same for naive: G·H·L / (G·H + H + G·L) >= balance, i.e. L >= balance·H·(G + 1) / (G·(H - balance));
// infinity when H <= balance (the intensity tends to H and never gets there).
double naive_compute_bound_length(std::int64_t G, std::int64_t H, double balance);

// Bytes the rung keeps allocated at once (inputs and outputs in `dtype` plus its workspace).
double memory_bytes(Algorithm algorithm, const Shape& s, DType dtype, std::int64_t block_q,
                    std::int64_t block_kv, int threads);

}  // namespace flashgqa::study
