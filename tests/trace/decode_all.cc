#include "decode_all.h"

namespace meshtrace::test {

bool decodeAll(const uint8_t* data, size_t size, Error* error) {
  Trace trace;
  if (!trace.openBytes(data, size, error)) return false;
  MergedCursor merged(trace);
  Event event;
  while (merged.next(&event, error)) formatEvent(trace, event);
  if (error->failed()) return false;
  for (const ThreadInfo& info : trace.threads()) {
    ThreadCursor cursor(trace, info.thread);
    while (cursor.next(&event, error)) {
    }
    if (error->failed()) return false;
  }
  return true;
}

}  // namespace meshtrace::test
