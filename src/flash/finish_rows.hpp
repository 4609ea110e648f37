// The end of a flash task, shared by the packed and the decode paths: writing a finished row, and
// merging the partial (o, m, l) of a row whose KV range was split, in a fixed order so the result does
// not depend on which thread computed which part.
#pragma once

#include <cstdint>

#include "core/problem.hpp"

namespace flashgqa {

// out[b,kh,g,t,:] = o / l in out's dtype; lse = m + log l. A row that sees no key gets 0 and -inf.
// tmp: H floats of scratch.
void write_flash_row(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t,
                     const float* o, float m, float l, float* tmp);

// Merges `count` partial results of one row, part i at m[i * ml_stride], l[i * ml_stride] and
// o[i * o_stride .. + H), in index order: m* = max m_i, l* = sum l_i e^(m_i - m*),
// o* = sum o_i e^(m_i - m*); then writes the row. A NaN m_i is kept, so a NaN reaches the output.
// acc and tmp: H floats of scratch each.
void merge_flash_row(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t,
                     std::int64_t count, const float* m, const float* l, std::int64_t ml_stride,
                     const float* o, std::int64_t o_stride, float* acc, float* tmp);

}  // namespace flashgqa
