// The end of every softmax algorithm's row, in one place: the ladder rungs, the packed flash path and
// the decode path all write a finished row through finish_row, and the flash paths merge the partial
// results of a row whose KV range was split through merge_row (a fixed order, so the result does not
// depend on which thread computed which part).
#pragma once

#include <cstdint>

#include "core/problem.hpp"

namespace flashgqa {

// out[b,kh,g,t,:] = acc / l in out's dtype (acc is overwritten), lse = m + log l. A row with l == 0
// (it saw no key, or every logit it saw was -inf) gets 0 and lse -inf. With Problem::sinks the
// denominator gains e^sink of the row's head (out = acc e^m / (l e^m + e^sink)), and a row with l == 0
// gets 0 and lse = sink. acc and l are in units of e^m (m = 0 for an unshifted sum).
void finish_row(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t, float* acc,
                float m, float l);

// Merges `count` partial results of one row, part i at m[i * ml_stride], l[i * ml_stride] and
// o[i * o_stride .. + H), in index order: m* = max m_i, l* = sum l_i e^(m_i - m*),
// o* = sum o_i e^(m_i - m*); then finishes the row. A NaN m_i is kept, so a NaN reaches the output.
// acc: H floats of scratch.
void merge_row(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t,
               std::int64_t count, const float* m, const float* l, std::int64_t ml_stride, const float* o,
               std::int64_t o_stride, float* acc);

}  // namespace flashgqa
