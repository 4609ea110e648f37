// Workspace blocks kept across calls. A decode call of a few milliseconds allocates its threads'
// workspaces (S, P, the packed V, O and the split partials: hundreds of KiB a thread) and frees them at
// its end; blocks that large come from fresh pages each time (glibc maps them), so every call paid a
// page fault per 4 KiB (perf, 2 threads, a 2 ms call: 12% of the time in the kernel). Kept, a decode
// step of 2048 keys at T = 16 took 1.7-2.0 ms instead of 2.2-2.7, and T = 16 at 32768 keys 27.1-28.0
// instead of 29.2-33.8 (docs/performance.md, session 28, 2 Zen 4 cores). AlignedBuffer takes its
// blocks of kCachedBlockMinBytes or more from here.
//
// A freed block is kept (most recent last) while the blocks kept total at most kWorkspaceCacheBytes;
// the oldest go first to make room, and a block larger than that is freed at once. An allocation takes
// the smallest kept block of at least its size and at most twice it, else a new one. Any thread may
// allocate and free (one mutex; a call allocates a few blocks, not one per task), and fork while others
// do (the mutex is taken around fork: pthread_atfork). free_workspace_cache() (flashgqa.hpp) hands
// every kept block back.
//
// A block's contents are undefined, as with any allocation. In sanitizer builds
// (FLASHGQA_POISON_WORKSPACES) every block handed out is first filled with 0xff bytes (a NaN in every
// float and bf16), so that code that reads workspace it never wrote fails the tests, fresh block or kept;
// under AddressSanitizer a kept block is poisoned, so a use of a buffer after its end is still reported.
#pragma once

#include <cstddef>

namespace flashgqa {

constexpr std::size_t kCachedBlockMinBytes = std::size_t{64} << 10;
constexpr std::size_t kWorkspaceCacheBytes = std::size_t{64} << 20;

// bytes (a multiple of 64, > 0) at a 64-byte boundary; throws std::bad_alloc when none is left.
void* workspace_alloc(std::size_t bytes);
// Gives back a block of workspace_alloc(bytes) (null: nothing).
void workspace_free(void* block, std::size_t bytes) noexcept;
// The bytes of the blocks kept now.
std::size_t workspace_cache_bytes();

}  // namespace flashgqa
