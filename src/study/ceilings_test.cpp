// The DRAM read loops behind measure_dram_read (the portable one and each vector one this machine runs): with and without the page-ahead prefetch they read
// every byte (changing any byte changes the result) and report the bytes they streamed.
#include "study/ceilings.hpp"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "kernels/cpu_features.hpp"

namespace flashgqa::study {
namespace {

using ReadLoop = double (*)(const void*, long, long, long*);

long sink_of(ReadLoop loop, const void* data, long bytes, long ahead) {
  long sink = 0;
  EXPECT_EQ(loop(data, bytes, ahead, &sink), static_cast<double>(bytes));
  return sink;
}

TEST(Ceilings, ReadLoopsReadEveryByte) {
  constexpr long kBytes = 3 * 4096 + 512;  // pages and a partial page, a multiple of 256
  AlignedBuffer buf;
  buf.reset(kBytes);
  auto* bytes = static_cast<unsigned char*>(buf.data());
  for (long i = 0; i < kBytes; ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 3);
  std::vector<std::pair<Isa, ReadLoop>> loops = {{Isa::portable, detail::read_loop_portable}};
#if defined(FLASHGQA_X86_CEILINGS)
  if (isa_supported(Isa::avx512f)) loops.push_back({Isa::avx512f, detail::read_loop_avx512});
  if (isa_supported(Isa::avx2)) loops.push_back({Isa::avx2, detail::read_loop_avx2});
#elif defined(FLASHGQA_ARM_CEILINGS)
  if (isa_supported(Isa::neon)) loops.push_back({Isa::neon, detail::read_loop_neon});
#endif
  for (const auto& [isa, loop] : loops)
    for (long ahead : {0L, 4096L, kDramPageAhead}) {
      const long base = sink_of(loop, bytes, kBytes, ahead);
      EXPECT_EQ(base, sink_of(loop, bytes, kBytes, 0)) << isa_name(isa) << " ahead " << ahead;
      for (long at : {0L, 63L, 4095L, 4096L, 9000L, kBytes - 1}) {
        bytes[at] ^= 0x40;
        EXPECT_NE(sink_of(loop, bytes, kBytes, ahead), base) << isa_name(isa) << " ahead " << ahead << " byte " << at;
        bytes[at] ^= 0x40;
      }
    }
}

}  // namespace
}  // namespace flashgqa::study
