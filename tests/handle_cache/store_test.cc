// The LRU cache's key space (bench/handle_cache/store.h), its protocol parser and its option
// syntax, in-process. The store runs over a storage policy of this test that moves a payload
// whenever it is pinned or unpinned and poisons and frees the old copy, so a pointer the store
// used outside a pin reads poison (and ASan reports it): the contract handles impose, checked
// without the allocator.
#include <gtest/gtest.h>
#include <malloc.h>
#include <string.h>

#include <map>
#include <string>
#include <vector>

#include "options.h"
#include "resp.h"
#include "store.h"

namespace handle_cache {
namespace {

constexpr unsigned char kPoison = 0xdb;

// Handles are 1-based slot numbers with a generation above bit 32; a stale or unknown one
// fails the test at once.
struct MovingStorage {
  struct Slot {
    unsigned char* bytes = nullptr;
    size_t size = 0;
    uint32_t generation = 0;
    int pins = 0;
  };
  static inline std::vector<Slot> slots;
  static inline size_t live = 0;
  static inline size_t moves = 0;

  static Slot& slot(Ref ref) {
    size_t index = static_cast<size_t>(ref & 0xffffffffu) - 1;
    if (index >= slots.size() || slots[index].bytes == nullptr ||
        slots[index].generation != (ref >> 32)) {
      ADD_FAILURE() << "stale or unknown reference " << ref;
      abort();
    }
    return slots[index];
  }
  static size_t rounded(size_t size) { return (size + 63) & ~size_t{63}; }

  static Ref allocate(size_t size) {
    slots.push_back({static_cast<unsigned char*>(malloc(rounded(size))), size,
                     static_cast<uint32_t>(slots.size() * 7 + 1), 0});
    live++;
    return (Ref{slots.back().generation} << 32) | slots.size();
  }
  static void release(Ref ref) {
    Slot& s = slot(ref);
    EXPECT_EQ(s.pins, 0) << "freed while pinned";
    memset(s.bytes, kPoison, rounded(s.size));
    free(s.bytes);
    s.bytes = nullptr;
    live--;
  }
  static size_t usable(Ref ref) { return rounded(slot(ref).size); }
  // An unpinned object may move at any time: here it moves whenever it becomes unpinned and
  // again when it is pinned, so neither a pointer kept from before the pin nor one used after
  // the unpin reaches it.
  static void move(Slot& s) {
    auto* copy = static_cast<unsigned char*>(malloc(rounded(s.size)));
    memcpy(copy, s.bytes, rounded(s.size));
    memset(s.bytes, kPoison, rounded(s.size));
    free(s.bytes);
    s.bytes = copy;
    moves++;
  }
  static void* pin(Ref ref) {
    Slot& s = slot(ref);
    if (s.pins++ == 0) move(s);
    return s.bytes;
  }
  static void unpin(Ref ref) {
    Slot& s = slot(ref);
    EXPECT_GT(s.pins, 0) << "unpin without pin";
    if (--s.pins == 0) move(s);
  }
  static int pinned() {
    int total = 0;
    for (const Slot& s : slots) total += s.bytes != nullptr ? s.pins : 0;
    return total;
  }
};

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MovingStorage::slots.clear();
    MovingStorage::live = 0;
  }
  void TearDown() override {
    store.clear();
    EXPECT_EQ(MovingStorage::live, 0u) << "entries leaked";
  }
  // Every payload's usable size.
  size_t expectedUsed() const {
    size_t total = 0;
    for (const auto& s : MovingStorage::slots) {
      if (s.bytes != nullptr) total += MovingStorage::rounded(s.size);
    }
    return total;
  }
  std::string get(const std::string& key) {
    std::string out;
    return store.get(key, out) ? out : "<none>";
  }
  Store<MovingStorage> store{42};
};

TEST_F(StoreTest, SetGetEraseAcrossMovesAndGrowth) {
  for (int i = 0; i < 5000; i++) {
    ASSERT_TRUE(store.set("key:" + std::to_string(i), std::string(i % 300, 'a' + i % 26)));
  }
  EXPECT_EQ(store.size(), 5000u);
  EXPECT_GE(store.buckets(), 5000u * kMaxLoadDenominator / kMaxLoadNumerator);  // it grew
  for (int i = 0; i < 5000; i++) {
    ASSERT_EQ(get("key:" + std::to_string(i)), std::string(i % 300, 'a' + i % 26)) << i;
  }
  ASSERT_TRUE(store.set("key:7", "replaced"));
  EXPECT_EQ(get("key:7"), "replaced");
  EXPECT_EQ(store.size(), 5000u);
  for (int i = 0; i < 5000; i += 2) EXPECT_TRUE(store.erase("key:" + std::to_string(i)));
  EXPECT_FALSE(store.erase("key:0"));
  EXPECT_EQ(get("key:0"), "<none>");
  EXPECT_EQ(get("key:1"), std::string(1, 'b'));
  EXPECT_EQ(store.size(), 2500u);
  EXPECT_EQ(store.stats().misses, 1u);
  EXPECT_EQ(MovingStorage::pinned(), 0) << "a pin was not undone";
  EXPECT_GT(MovingStorage::moves, 10000u);
}

TEST_F(StoreTest, UsedMemoryIsTheUsableSizesOfPayloadsAndTable) {
  size_t table = store.usedMemory();
  EXPECT_GE(table, kInitialSlots * sizeof(IndexSlot));
  for (int i = 0; i < 300; i++) store.set("k" + std::to_string(i), std::string(100 + i, 'x'));
  for (int i = 0; i < 300; i += 3) store.erase("k" + std::to_string(i));
  store.set("k1", "short now");
  // A key is its payload alone (its usable size rounded to 64 here): the index is the table.
  ASSERT_EQ(store.size(), 200u);
  EXPECT_EQ(store.entryBytes(), expectedUsed());
  EXPECT_EQ(store.usedMemory(), store.entryBytes() + table);
  for (int i = 0; i < 300; i++) store.erase("k" + std::to_string(i));
  EXPECT_EQ(store.entryBytes(), 0u);  // every byte counted in was counted out
  EXPECT_EQ(store.usedMemory(), table);
}

// Deletion closes the gap it leaves in a probe run (no tombstones): a key whose run crossed the
// gap must still be found, across growth and shrinking. Checked against a map on random
// operations over few keys, so that runs are long and cross the table's end.
TEST_F(StoreTest, RandomSetsAndErasesMatchAMap) {
  std::map<std::string, std::string> model;
  uint64_t random = 7;
  for (int step = 0; step < 60000; step++) {
    random = mix64(random + step);
    // Grows to thousands of keys, then empties, so that the table doubles and halves.
    int keys = step < 30000 ? 4000 : 4000 - (step - 30000) * 4000 / 30000;
    std::string key = "key:" + std::to_string(random % static_cast<uint64_t>(keys + 1));
    if ((random >> 20) % 3 != 0 && step < 30000) {
      std::string value(1 + (random >> 32) % 50, static_cast<char>('a' + step % 26));
      ASSERT_TRUE(store.set(key, value));
      model[key] = value;
    } else {
      ASSERT_EQ(store.erase(key), model.erase(key) == 1) << key << " at step " << step;
    }
    if (step % 1000 == 999) {
      for (const auto& [k, v] : model) ASSERT_EQ(get(k), v) << k << " at step " << step;
      ASSERT_EQ(store.size(), model.size());
    }
  }
  for (auto it = model.begin(); it != model.end();) {
    ASSERT_TRUE(store.erase(it->first));
    it = model.erase(it);
  }
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.buckets(), kInitialSlots);  // shrunk back as it emptied
  EXPECT_EQ(MovingStorage::pinned(), 0);
}

TEST_F(StoreTest, EvictionTakesTheIdlestKeys) {
  // Redis's allkeys-lru with 5 samples and a pool of 16: with the old keys 100 s idler than the
  // new ones, every eviction takes an old key while old keys are plentiful.
  store.setClock(1000);
  for (int i = 0; i < 1000; i++) store.set("old:" + std::to_string(i), "v");
  store.setClock(1100);
  for (int i = 0; i < 1000; i++) store.set("new:" + std::to_string(i), "v");
  // Reading an old key makes it recent: it must survive too.
  for (int i = 0; i < 100; i++) EXPECT_EQ(get("old:" + std::to_string(i)), "v");
  for (int i = 0; i < 600; i++) ASSERT_TRUE(store.evictOne(5));
  EXPECT_EQ(store.stats().evicted, 600u);
  int newLeft = 0, readLeft = 0;
  for (int i = 0; i < 1000; i++) newLeft += get("new:" + std::to_string(i)) == "v";
  for (int i = 0; i < 100; i++) readLeft += get("old:" + std::to_string(i)) == "v";
  EXPECT_EQ(newLeft, 1000);
  EXPECT_EQ(readLeft, 100);
  EXPECT_EQ(store.size(), 1400u);
}

TEST_F(StoreTest, EvictionEmptiesTheStoreAndForgetsFreedCandidates) {
  for (int i = 0; i < 500; i++) store.set("k" + std::to_string(i), "value");
  store.evictOne(5);  // fills the pool with candidates ...
  for (int i = 0; i < 500; i += 2) store.erase("k" + std::to_string(i));  // ... and frees many
  size_t evicted = 0;
  while (store.evictOne(5)) evicted++;  // a freed candidate would be a stale reference
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.entryBytes(), 0u);
  EXPECT_GE(evicted, 249u);
  EXPECT_FALSE(store.evictOne(5));
}

TEST(RespTest, ParsesArraysAtEveryPrefixAndInlineCommands) {
  std::string request = "*3\r\n$3\r\nSET\r\n$4\r\nkey1\r\n$0\r\n\r\n*1\r\n$4\r\nPING\r\n";
  std::vector<std::string_view> arguments;
  size_t first = request.find("*1");
  for (size_t length = 0; length < first; length++) {
    EXPECT_EQ(parseRequest(std::string_view(request).substr(0, length), arguments).status,
              ParseStatus::kIncomplete)
        << length;
  }
  ParseResult parsed = parseRequest(request, arguments);
  ASSERT_EQ(parsed.status, ParseStatus::kComplete);
  EXPECT_EQ(parsed.consumed, first);
  ASSERT_EQ(arguments.size(), 3u);
  EXPECT_EQ(arguments[1], "key1");
  EXPECT_EQ(arguments[2], "");
  parsed = parseRequest("get  some:key\r\n", arguments);
  ASSERT_EQ(parsed.status, ParseStatus::kComplete);
  ASSERT_EQ(arguments.size(), 2u);
  EXPECT_EQ(arguments[1], "some:key");
}

TEST(RespTest, RejectsMalformedRequests) {
  std::vector<std::string_view> arguments;
  for (const char* bad :
       {"*x\r\n", "*1\r\n+PING\r\n", "*1\r\n$-3\r\n", "*1\r\n$2\r\nabcd\r\n", "*2000000\r\n"}) {
    EXPECT_EQ(parseRequest(bad, arguments).status, ParseStatus::kError) << bad;
  }
}

TEST(OptionsTest, MemorySizesAsRedisReadsThem) {
  uint64_t bytes = 0;
  ASSERT_TRUE(parseMemory("100mb", &bytes));
  EXPECT_EQ(bytes, 100u << 20);
  ASSERT_TRUE(parseMemory("4MB", &bytes));
  EXPECT_EQ(bytes, 4u << 20);
  ASSERT_TRUE(parseMemory("1k", &bytes));
  EXPECT_EQ(bytes, 1000u);
  ASSERT_TRUE(parseMemory("4096", &bytes));
  EXPECT_EQ(bytes, 4096u);
  for (const char* bad : {"", "mb", "10xb", "-1", "99999999999999999999gb"}) {
    EXPECT_FALSE(parseMemory(bad, &bytes)) << bad;
  }
}

}  // namespace
}  // namespace handle_cache
