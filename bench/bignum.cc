// bignum: arbitrary-precision integer arithmetic on heap-allocated digit arrays, the pattern of
// cfrac (factoring by continued fractions on a small bignum library in which every operation
// returns a freshly malloc'd number and its operands die soon after). The program is a stream
// of small, short-lived allocations of many sizes between real arithmetic. Each round draws
// 2 - 8 factors of 32 bits and multiplies them by a product tree (every inner node a fresh
// number, both children freed), then divides the product by the factors one after the other
// down to 1, adding each quotient to a running sum (a fresh number per division and per sum).
// Every division must leave no remainder and the last quotient must be exactly 1: a check of
// the arithmetic and so of every digit the allocator kept. The checksum folds in every round's
// sum: the same under every allocator. Numbers stay within 9 digits of 32 bits (52 bytes with
// the header), the size of cfrac's numbers of a few dozen decimal digits; more factors would
// make the divisions' quadratic cost, the same under every allocator, swamp the allocations.
#include <iterator>
#include <utility>

#include "common.h"

namespace {

uint64_t gRounds = 1200000, gMaxFactors = 8, gSeed = 1;

constexpr uint64_t kFactorLimit = 64;
constexpr uint64_t kTag = 0x6269676e756dULL;  // "bignum"

uint64_t gAllocations = 0;

// A number: a header, then `length` 32-bit digits, least significant first, the top one
// non-zero (zero has none). The header's tag, which depends on the length, is the word the
// benchmark checks before every free.
struct Num {
  uint64_t tag;
  uint64_t length;

  uint32_t* digits() { return reinterpret_cast<uint32_t*>(this + 1); }
  const uint32_t* digits() const { return reinterpret_cast<const uint32_t*>(this + 1); }
};

uint64_t tagOf(uint64_t length) {
  return bench::tagFor(length, kTag);
}

// Room for `capacity` digits; finish() sets the length once they are written.
Num* make(uint64_t capacity) {
  gAllocations++;
  return static_cast<Num*>(bench::mustMalloc(sizeof(Num) + capacity * sizeof(uint32_t)));
}

Num* finish(Num* number, uint64_t length) {
  while (length && number->digits()[length - 1] == 0) length--;
  number->length = length;
  number->tag = tagOf(length);
  return number;
}

void release(Num* number) {
  bench::checkWord(number, tagOf(number->length));
  free(number);
}

Num* fromDigit(uint32_t digit) {
  Num* number = make(1);
  number->digits()[0] = digit;
  return finish(number, 1);
}

Num* add(const Num* a, const Num* b) {
  if (a->length < b->length) std::swap(a, b);
  Num* sum = make(a->length + 1);
  uint64_t carry = 0;
  for (uint64_t i = 0; i < a->length; i++) {
    carry += static_cast<uint64_t>(a->digits()[i]) + (i < b->length ? b->digits()[i] : 0);
    sum->digits()[i] = static_cast<uint32_t>(carry);
    carry >>= 32;
  }
  sum->digits()[a->length] = static_cast<uint32_t>(carry);
  return finish(sum, a->length + 1);
}

Num* multiply(const Num* a, const Num* b) {
  const uint64_t length = a->length + b->length;
  Num* result = make(length);
  uint32_t* out = result->digits();
  memset(out, 0, length * sizeof(uint32_t));
  for (uint64_t i = 0; i < a->length; i++) {
    uint64_t carry = 0;
    for (uint64_t j = 0; j < b->length; j++) {
      carry += static_cast<uint64_t>(a->digits()[i]) * b->digits()[j] + out[i + j];
      out[i + j] = static_cast<uint32_t>(carry);
      carry >>= 32;
    }
    out[i + b->length] = static_cast<uint32_t>(carry);
  }
  return finish(result, length);
}

// a / divisor, the remainder in *remainder.
Num* divide(const Num* a, uint32_t divisor, uint32_t* remainder) {
  Num* quotient = make(a->length);
  uint64_t rest = 0;
  for (uint64_t i = a->length; i-- > 0;) {
    const uint64_t current = (rest << 32) | a->digits()[i];
    quotient->digits()[i] = static_cast<uint32_t>(current / divisor);
    rest = current % divisor;
  }
  *remainder = static_cast<uint32_t>(rest);
  return finish(quotient, a->length);
}

Num* product(const uint32_t* factors, uint64_t count) {
  if (count == 1) return fromDigit(factors[0]);
  const uint64_t half = count / 2;
  Num* left = product(factors, half);
  Num* right = product(factors + half, count - half);
  Num* result = multiply(left, right);
  release(left);
  release(right);
  return result;
}

[[noreturn]] void wrong(uint64_t round, const char* what) {
  fprintf(stderr, "bignum: round %llu: %s: the digits were corrupted\n",
          static_cast<unsigned long long>(round), what);
  abort();
}

// One round; returns the digest of its sum.
uint64_t oneRound(bench::Rng& rng, uint64_t index) {
  uint32_t factors[kFactorLimit];
  const uint64_t count = rng.between(2, gMaxFactors);
  for (uint64_t k = 0; k < count; k++) factors[k] = static_cast<uint32_t>(rng.between(2, ~0u));
  Num* rest = product(factors, count);
  Num* sum = finish(make(0), 0);
  for (uint64_t k = 0; k < count; k++) {
    uint32_t remainder;
    Num* quotient = divide(rest, factors[k], &remainder);
    if (remainder != 0) wrong(index, "a factor does not divide the product");
    Num* next = add(sum, quotient);
    release(rest);
    release(sum);
    rest = quotient;
    sum = next;
  }
  if (rest->length != 1 || rest->digits()[0] != 1) wrong(index, "the last quotient is not 1");
  uint64_t digest = sum->length;
  for (uint64_t i = 0; i < sum->length; i++)
    digest = (digest ^ sum->digits()[i]) * 0x100000001b3ULL;
  release(rest);
  release(sum);
  return digest;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"rounds", &gRounds, "products built and divided down again"},
      {"factors", &gMaxFactors, "most factors of 32 bits per product, 2 - 64"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "bignum", options);
  if (gMaxFactors < 2 || gMaxFactors > kFactorLimit)
    bench::usage(argv[0], "bignum", options, std::size(options), "bad values");

  bench::Rng rng(gSeed);
  uint64_t checksum = 0;
  double start = bench::now();
  for (uint64_t r = 0; r < gRounds; r++) checksum = checksum * 31 + oneRound(rng, r);
  double seconds = bench::now() - start;

  bench::report("bignum", 1, seconds, gAllocations, checksum);
  return 0;
}
