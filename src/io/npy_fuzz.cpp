// libFuzzer target for the .npy reader (scripts/fuzz.sh): every input either parses or throws
// flashgqa::Error; anything else (a crash, a sanitizer report, another exception, a hang) is a bug.
// A parsed array must agree with itself: its data holds exactly numel * element size bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "io/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const flashgqa::NpyArray a = flashgqa::parse_npy(data, size, "fuzz.npy");
    if (a.data.size() != static_cast<std::size_t>(a.numel()) * flashgqa::dtype_size(a.dtype)) std::abort();
  } catch (const flashgqa::Error&) {
  }
  return 0;
}
