// Ctrl-C during a call of flashgqa._flashgqa from Python's main thread (where Python delivers
// KeyboardInterrupt). While such a call runs, SIGINT only sets a flag (one lock-free store:
// async-signal-safe); the library polls it between tasks (Options::interrupt) and stops with
// flashgqa::Interrupted, which becomes KeyboardInterrupt. Python's handler is restored when the call
// returns, and a SIGINT that came too late to stop the call is raised again then, so Python still
// sees it. Calls from other threads, and processes that ignore SIGINT, leave the handler alone.
// Separate from the entry points (flashgqa_ext.cpp), which only call run_interruptible.
#pragma once

#include <nanobind/nanobind.h>
#include <signal.h>

#include <atomic>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa::py {

class SigintWatch {
 public:
  SigintWatch();
  ~SigintWatch();
  SigintWatch(const SigintWatch&) = delete;
  SigintWatch& operator=(const SigintWatch&) = delete;
  bool installed() const { return installed_; }
  // The flag the handler sets, for Options::interrupt (only meaningful when installed()).
  static const std::atomic<bool>* flag();
  bool stopped = false;  // the call threw Interrupted: KeyboardInterrupt is already on its way

 private:
  struct sigaction previous_ {};
  bool installed_ = false;
};

// Runs call(options) with the GIL released and, from the main thread, Ctrl-C watched.
template <typename Call>
void run_interruptible(flashgqa::Options options, Call call) {
  SigintWatch watch;
  if (watch.installed()) options.interrupt = SigintWatch::flag();
  try {
    nanobind::gil_scoped_release release;
    call(options);
  } catch (const flashgqa::Interrupted&) {
    watch.stopped = true;
    throw;
  }
}

}  // namespace flashgqa::py
