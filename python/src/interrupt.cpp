// Ctrl-C during a call from Python's main thread (see interrupt.hpp): the SIGINT handler, its flag,
// and installing and restoring it around one call.
#include "interrupt.hpp"

namespace flashgqa::py {

namespace {

static_assert(std::atomic<bool>::is_always_lock_free, "the SIGINT handler needs a lock-free flag");
std::atomic<bool> g_sigint{false};

extern "C" void on_sigint(int) { g_sigint.store(true, std::memory_order_relaxed); }

unsigned long main_thread_ident() {
  static const unsigned long ident = [] {
    nanobind::object threading = nanobind::module_::import_("threading");
    return nanobind::cast<unsigned long>(threading.attr("main_thread")().attr("ident"));
  }();
  return ident;
}

}  // namespace

SigintWatch::SigintWatch() {
  if (!PyGILState_Check() || PyThread_get_thread_ident() != main_thread_ident()) return;
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGINT, nullptr, &previous_) != 0 || previous_.sa_handler == SIG_IGN) return;
  g_sigint.store(false);
  installed_ = sigaction(SIGINT, &sa, nullptr) == 0;
}

SigintWatch::~SigintWatch() {
  if (!installed_) return;
  sigaction(SIGINT, &previous_, nullptr);
  if (g_sigint.exchange(false) && !stopped) raise(SIGINT);  // too late to stop the call: Python's turn
}

const std::atomic<bool>* SigintWatch::flag() { return &g_sigint; }

}  // namespace flashgqa::py
