// RESP, Redis's protocol, as far as the cache needs it: requests (arrays of bulk strings, or
// inline lines) and the five reply types.
#ifndef HANDLE_CACHE_RESP_H
#define HANDLE_CACHE_RESP_H

#include <stddef.h>
#include <stdint.h>

#include <string>
#include <string_view>
#include <vector>

namespace handle_cache {

// Redis's own limits (proto-max-bulk-len, the multibulk count) for a request.
inline constexpr int64_t kMaxBulkLength = 512LL * 1024 * 1024;
inline constexpr int64_t kMaxArguments = 1024 * 1024;
inline constexpr size_t kMaxInlineLength = 64 * 1024;

enum class ParseStatus { kComplete, kIncomplete, kError };

struct ParseResult {
  ParseStatus status;
  size_t consumed;    // bytes of the buffer the request took (kComplete)
  const char* error;  // what is wrong (kError)
};

// Parses one request from `buffer`; its arguments point into `buffer`.
ParseResult parseRequest(std::string_view buffer, std::vector<std::string_view>& arguments);

void replySimple(std::string& out, std::string_view text);  // +text
void replyError(std::string& out, std::string_view text);   // -text
void replyInteger(std::string& out, int64_t value);         // :value
void replyBulk(std::string& out, std::string_view text);    // $length text
void replyNull(std::string& out);                           // $-1
void replyArrayHeader(std::string& out, size_t count);      // *count

bool equalsIgnoreCase(std::string_view a, std::string_view b);

}  // namespace handle_cache

#endif
