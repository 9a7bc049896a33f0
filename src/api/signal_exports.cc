// sigaction() and signal() as the application sees them. For SIGSEGV, once the write barrier
// has installed its handler, the application's handler is recorded and chained to instead of
// replacing ours (see mesh/write_barrier.h); every other call goes straight to glibc.
#include <errno.h>
#include <signal.h>
#include <string.h>

#include "api/export.h"
#include "mesh/write_barrier.h"
#include "platform/os.h"

using meshalloc::WriteBarrier;

MESHALLOC_EXPORT int sigaction(int signal, const struct sigaction* action,
                               struct sigaction* previous) {
  int result;
  if (WriteBarrier::interceptSigaction(signal, action, previous, &result)) return result;
  return meshalloc::os::rawSigaction(signal, action, previous);
}

namespace {
sighandler_t installSimpleHandler(int signal, sighandler_t handler, int flags) {
  struct sigaction action, previous;
  memset(&action, 0, sizeof(action));
  action.sa_handler = handler;
  action.sa_flags = flags;
  sigemptyset(&action.sa_mask);
  if (signal > 0 && signal < NSIG && !(flags & SA_NODEFER)) sigaddset(&action.sa_mask, signal);
  if (sigaction(signal, &action, &previous) != 0) return SIG_ERR;
  return previous.sa_handler;
}
}  // namespace

// glibc's signal() has BSD semantics: the handler stays installed and calls restart.
MESHALLOC_EXPORT sighandler_t signal(int signal, sighandler_t handler) {
  return installSimpleHandler(signal, handler, SA_RESTART);
}
MESHALLOC_EXPORT sighandler_t bsd_signal(int signal, sighandler_t handler) {
  return installSimpleHandler(signal, handler, SA_RESTART);
}
MESHALLOC_EXPORT sighandler_t sysv_signal(int signal, sighandler_t handler) {
  return installSimpleHandler(signal, handler, SA_RESETHAND | SA_NODEFER);
}
