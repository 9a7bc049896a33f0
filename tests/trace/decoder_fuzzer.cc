// libFuzzer target for the trace decoder (docs/trace.md, docs/testing.md): any bytes must be
// read or rejected with an error naming an offset inside them, never crash. Built by the `fuzz`
// preset (ASan + UBSan); `make fuzz-trace` runs it from tests/trace/corpus.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "decode_all.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  meshtrace::Error error;
  if (!meshtrace::test::decodeAll(data, size, &error) &&
      (error.message.empty() || error.offset > size))
    abort();
  return 0;
}
