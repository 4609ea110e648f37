// flashgqa on NVIDIA GPUs (built only with -DFLASHGQA_CUDA=ON; Hopper, sm_90a): the seed's fused flash
// attention forward, one thread block per (batch, kv head, block of query rows) holding all G query
// heads of that kv head, so each K/V tile read from device memory serves G heads.
#pragma once

#include "flashgqa/flashgqa.hpp"

namespace flashgqa::cuda {

// out <- attention(q, k, v) on the GPU: the same shapes, strides and Options meaning as
// flashgqa::attention, with every view's data a pointer to memory of the current device (cudaMalloc'd
// or managed; checked, as an Error). What this path takes today:
//   q, k, v, out bfloat16, H in {64, 128, 256}, each row (h) contiguous and 16-byte aligned (the
//   base pointer, and every stride other than h's where that dimension has more than one index, a
//   multiple of 8 elements); S up to 2^31 - 257;
//   Options::scale (|scale| log2(e) a finite float), causal and causal_offset; lse (float32, any
//   strides) when given. Options::threads and Options::interrupt are not used.
// Every other option (window, softcap, sinks, packed sequences, Precision::f32, block sizes) and any
// other dtype or head size throws Error before the launch, naming what was given and what is taken.
// The work is queued on `stream` (a cudaStream_t; null = the default stream) and the call returns
// without waiting; a launch failure throws Error with CUDA's message. A row that sees no key gets
// out 0 and lse -inf.
void attention(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v,
               const Options& options = {}, void* stream = nullptr);
void attention(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
               const TensorView& v, const Options& options = {}, void* stream = nullptr);

}  // namespace flashgqa::cuda
