// Formats text into a fixed buffer without allocating, for diagnostics and statistics that
// are printed from inside the allocator (where printf could re-enter malloc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc {

class TextWriter {
 public:
  TextWriter(char* buffer, size_t capacity) : buffer_(buffer), capacity_(capacity) {}

  TextWriter& text(const char* s) {
    while (*s) put(*s++);
    return *this;
  }
  TextWriter& unsignedValue(uint64_t value) {
    char digits[24];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value);
    while (n) put(digits[--n]);
    return *this;
  }
  TextWriter& signedValue(int64_t value) {
    if (value < 0) {
      put('-');
      return unsignedValue(static_cast<uint64_t>(-(value + 1)) + 1);
    }
    return unsignedValue(static_cast<uint64_t>(value));
  }
  TextWriter& hex(uint64_t value) {
    text("0x");
    char digits[20];
    int n = 0;
    do {
      digits[n++] = "0123456789abcdef"[value & 0xf];
      value >>= 4;
    } while (value);
    while (n) put(digits[--n]);
    return *this;
  }
  TextWriter& pointer(const void* p) { return hex(reinterpret_cast<uintptr_t>(p)); }
  // Fixed-point with `decimals` digits after the point; enough for ratios and percentages.
  TextWriter& fixed(double value, int decimals) {
    if (value < 0) {
      put('-');
      value = -value;
    }
    uint64_t scale = 1;
    for (int i = 0; i < decimals; i++) scale *= 10;
    uint64_t scaled = static_cast<uint64_t>(value * static_cast<double>(scale) + 0.5);
    unsignedValue(scaled / scale);
    if (decimals > 0) {
      put('.');
      uint64_t fraction = scaled % scale;
      for (uint64_t d = scale / 10; d > 0; d /= 10)
        put(static_cast<char>('0' + (fraction / d) % 10));
    }
    return *this;
  }
  TextWriter& boolean(bool value) { return text(value ? "true" : "false"); }
  TextWriter& put(char c) {
    if (length_ + 1 < capacity_)
      buffer_[length_++] = c;
    else
      truncated_ = true;
    return *this;
  }

  const char* data() const { return buffer_; }
  size_t length() const { return length_; }
  bool truncated() const { return truncated_; }
  void reset() { length_ = 0; }
  const char* cString() {
    buffer_[length_] = '\0';
    return buffer_;
  }

 private:
  char* buffer_;
  size_t capacity_;
  size_t length_ = 0;
  bool truncated_ = false;
};

}  // namespace meshalloc
