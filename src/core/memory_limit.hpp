// Workspaces too large for this machine's memory: refused with a clear Error before anything is
// allocated (rather than an allocation that succeeds under Linux's overcommit and brings the OOM killer
// once touched, or a size that overflows 64 bits). Sizes are estimated in double, so no product
// overflows before the check.
#pragma once

#include <string>

namespace flashgqa {

// The machine's physical memory in bytes (sysconf, which asks the kernel: no file is read).
double physical_memory_bytes();

// Throws Error when `bytes` exceeds physical memory: "<what> needs <X> GiB of workspace, more than this
// machine's <Y> GiB of memory; expected <advice>".
void check_workspace(double bytes, const std::string& what, const std::string& advice);

}  // namespace flashgqa
