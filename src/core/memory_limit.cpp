#include "core/memory_limit.hpp"

#include <unistd.h>

#include <cstdio>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa {

double physical_memory_bytes() {
  static const double bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  }();
  return bytes;
}

void check_workspace(double bytes, const std::string& what, const std::string& advice) {
  const double memory = physical_memory_bytes();
  if (memory <= 0.0 || bytes <= memory) return;  // (unknown memory: the allocation itself decides)
  char buf[160];
  std::snprintf(buf, sizeof buf, " needs %.3g GiB of workspace, more than this machine's %.3g GiB of memory",
                bytes / 1073741824.0, memory / 1073741824.0);
  throw Error(what + buf + "; expected " + advice);
}

}  // namespace flashgqa
