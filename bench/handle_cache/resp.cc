#include "resp.h"

#include <string.h>

#include <charconv>

namespace handle_cache {

namespace {

// The number on the line starting at `start` after its type byte, and where the line ends.
// False when the line is incomplete (*end = npos) or not a number.
bool readNumberLine(std::string_view buffer, size_t start, int64_t* value, size_t* end) {
  size_t newline = buffer.find("\r\n", start);
  *end = newline;
  if (newline == std::string_view::npos) return false;
  const char* first = buffer.data() + start + 1;
  const char* last = buffer.data() + newline;
  auto [ptr, ec] = std::from_chars(first, last, *value);
  return ec == std::errc() && ptr == last;
}

ParseResult parseInline(std::string_view buffer, std::vector<std::string_view>& arguments) {
  size_t newline = buffer.find('\n');
  if (newline == std::string_view::npos) {
    if (buffer.size() > kMaxInlineLength) return {ParseStatus::kError, 0, "too big inline request"};
    return {ParseStatus::kIncomplete, 0, nullptr};
  }
  std::string_view line = buffer.substr(0, newline);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  size_t at = 0;
  while (at < line.size()) {
    while (at < line.size() && (line[at] == ' ' || line[at] == '\t')) at++;
    size_t begin = at;
    while (at < line.size() && line[at] != ' ' && line[at] != '\t') at++;
    if (at > begin) arguments.push_back(line.substr(begin, at - begin));
  }
  return {ParseStatus::kComplete, newline + 1, nullptr};
}

}  // namespace

ParseResult parseRequest(std::string_view buffer, std::vector<std::string_view>& arguments) {
  arguments.clear();
  if (buffer.empty()) return {ParseStatus::kIncomplete, 0, nullptr};
  if (buffer[0] != '*') return parseInline(buffer, arguments);
  int64_t count;
  size_t end;
  if (!readNumberLine(buffer, 0, &count, &end)) {
    if (end == std::string_view::npos) return {ParseStatus::kIncomplete, 0, nullptr};
    return {ParseStatus::kError, 0, "invalid multibulk length"};
  }
  if (count > kMaxArguments) return {ParseStatus::kError, 0, "invalid multibulk length"};
  size_t at = end + 2;
  for (int64_t i = 0; i < count; i++) {
    if (at >= buffer.size()) return {ParseStatus::kIncomplete, 0, nullptr};
    if (buffer[at] != '$') return {ParseStatus::kError, 0, "expected '$'"};
    int64_t length;
    if (!readNumberLine(buffer, at, &length, &end)) {
      if (end == std::string_view::npos) return {ParseStatus::kIncomplete, 0, nullptr};
      return {ParseStatus::kError, 0, "invalid bulk length"};
    }
    if (length < 0 || length > kMaxBulkLength)
      return {ParseStatus::kError, 0, "invalid bulk length"};
    at = end + 2;
    if (buffer.size() - at < static_cast<size_t>(length) + 2) {
      return {ParseStatus::kIncomplete, 0, nullptr};
    }
    if (buffer.compare(at + static_cast<size_t>(length), 2, "\r\n") != 0) {
      return {ParseStatus::kError, 0, "bulk string not followed by CRLF"};
    }
    arguments.push_back(buffer.substr(at, static_cast<size_t>(length)));
    at += static_cast<size_t>(length) + 2;
  }
  return {ParseStatus::kComplete, at, nullptr};
}

void replySimple(std::string& out, std::string_view text) {
  out += '+';
  out += text;
  out += "\r\n";
}

void replyError(std::string& out, std::string_view text) {
  out += '-';
  out += text;
  out += "\r\n";
}

void replyInteger(std::string& out, int64_t value) {
  out += ':';
  out += std::to_string(value);
  out += "\r\n";
}

void replyBulk(std::string& out, std::string_view text) {
  out += '$';
  out += std::to_string(text.size());
  out += "\r\n";
  out += text;
  out += "\r\n";
}

void replyNull(std::string& out) {
  out += "$-1\r\n";
}

void replyArrayHeader(std::string& out, size_t count) {
  out += '*';
  out += std::to_string(count);
  out += "\r\n";
}

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace handle_cache
