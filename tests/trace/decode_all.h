// Decodes a whole trace the way every reader would (merged order with object ids, the text of
// each event, then each thread alone): shared by the decoder tests and the decoder fuzzer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "decoder.h"

namespace meshtrace::test {

// True when the bytes are a trace that decodes to the end; otherwise `error` says where not.
bool decodeAll(const uint8_t* data, size_t size, Error* error);

}  // namespace meshtrace::test
