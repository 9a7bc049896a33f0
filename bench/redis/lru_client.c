/*
 * lru_client: the load of the Redis LRU experiment (bench/redis/run.sh; paper section 6.2.2).
 *
 * Connects to a Redis server on 127.0.0.1:PORT and inserts random keys with SET, pipelined
 * (BATCH commands written at once, then their BATCH replies read), in two phases:
 *
 *   phase 1: 700,000 keys with 240-byte values
 *   phase 2: 170,000 keys with 492-byte values
 *
 * Keys are "key:<16 hex digits>" from a seeded 64-bit generator; values are taken from a
 * random printable buffer at a varying offset. With `maxmemory 100mb` and `allkeys-lru`, the
 * server evicts old keys as new ones arrive, so phase 2 frees most of phase 1's small values in
 * random order while allocating larger ones: the fragmentation the experiment is about.
 *
 * With --reads N (meshalloc bench handles), a third phase then sends N GETs, pipelined the
 * same way, of keys drawn at random from the ones inserted (most of them evicted by then: a
 * miss walks its hash chain as a hit does). total_s stays the insertion's time.
 *
 * With --rate N the insertion is paced at N keys per second (each batch waits until the keys
 * sent so far are due), so the server's pace is the client's whatever its allocator or a trace
 * recorder costs (meshalloc bench traces compares a recorded run with live ones this way).
 *
 * It speaks RESP directly (no hiredis): each command is an array of bulk strings; each reply
 * to SET is one line, "+OK" or "-ERR ..."; a reply to GET is a bulk string or "$-1". Error
 * replies are counted, not fatal.
 *
 * Output, one line on stdout, key=value pairs separated by spaces:
 *   lru_client phase1_keys=700000 phase1_value=240 phase1_s=1.234567 phase2_keys=170000
 *   phase2_value=492 phase2_s=0.345678 total_s=1.580245 errors=0 batch=256 seed=1
 * and with --reads, at the end: reads=500000 reads_s=0.456789 hits=123456
 *
 * Usage: lru_client --port PORT [--host 127.0.0.1] [--phase1 N] [--size1 B] [--phase2 N]
 *                   [--size2 B] [--batch N] [--seed S] [--reads N] [--rate KEYS_PER_S]
 *                   [--connect-timeout SECONDS]
 * Exit status: 0 on success, 1 on a usage or connection error, 2 when the server closes the
 * connection or answers something that is not a SET reply.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define KEY_HEX_DIGITS 16
#define VALUE_POOL 8192 /* random printable bytes values are cut from */
#define MAX_VALUE 65536
#define READ_CHUNK 65536
/* A reply buffer holds a whole GET reply (a value of up to MAX_VALUE bytes) and one read. */
#define REPLY_BUFFER (MAX_VALUE + 64 + READ_CHUNK)

struct options {
  const char* host;
  int port;
  long phase_keys[2];
  long value_size[2];
  long batch;
  long reads;
  long rate; /* keys per second; 0: as fast as the server answers */
  uint64_t seed;
  double connect_timeout;
};

static uint64_t rng_state;

/* splitmix64: small, fast, and every seed gives a full-period sequence. */
static uint64_t next_random(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage(const char* why) {
  fprintf(
      stderr,
      "lru_client: %s\nusage: lru_client --port PORT [--host ADDR] [--phase1 N] [--size1 BYTES] "
      "[--phase2 N] [--size2 BYTES] [--batch N] [--seed S] [--reads N] [--rate KEYS_PER_S] "
      "[--connect-timeout "
      "SECONDS]\n",
      why);
  exit(1);
}

static long parse_long(const char* name, const char* text, long min, long max) {
  char* end;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno || end == text || *end || value < min || value > max) {
    char message[160];
    snprintf(message, sizeof message, "bad value for %s: '%s' (%ld..%ld)", name, text, min, max);
    usage(message);
  }
  return value;
}

static void parse_options(int argc, char** argv, struct options* o) {
  o->host = "127.0.0.1";
  o->port = 0;
  o->phase_keys[0] = 700000;
  o->value_size[0] = 240;
  o->phase_keys[1] = 170000;
  o->value_size[1] = 492;
  o->batch = 256;
  o->reads = 0;
  o->rate = 0;
  o->seed = 1;
  o->connect_timeout = 5.0;
  for (int i = 1; i < argc; i++) {
    const char* name = argv[i];
    if (!strcmp(name, "--help") || !strcmp(name, "-h")) usage("help");
    if (i + 1 >= argc) usage("missing value after an option");
    const char* value = argv[++i];
    if (!strcmp(name, "--host"))
      o->host = value;
    else if (!strcmp(name, "--port"))
      o->port = (int)parse_long(name, value, 1, 65535);
    else if (!strcmp(name, "--phase1"))
      o->phase_keys[0] = parse_long(name, value, 0, 1L << 40);
    else if (!strcmp(name, "--size1"))
      o->value_size[0] = parse_long(name, value, 1, MAX_VALUE);
    else if (!strcmp(name, "--phase2"))
      o->phase_keys[1] = parse_long(name, value, 0, 1L << 40);
    else if (!strcmp(name, "--size2"))
      o->value_size[1] = parse_long(name, value, 1, MAX_VALUE);
    else if (!strcmp(name, "--batch"))
      o->batch = parse_long(name, value, 1, 100000);
    else if (!strcmp(name, "--rate"))
      o->rate = parse_long(name, value, 0, 1000000000L);
    else if (!strcmp(name, "--reads"))
      o->reads = parse_long(name, value, 0, 1L << 40);
    else if (!strcmp(name, "--seed"))
      o->seed = (uint64_t)parse_long(name, value, 0, INT64_MAX);
    else if (!strcmp(name, "--connect-timeout"))
      o->connect_timeout = (double)parse_long(name, value, 0, 3600);
    else {
      char message[160];
      snprintf(message, sizeof message, "unknown option '%s'", name);
      usage(message);
    }
  }
  if (!o->port) usage("--port is required");
}

/* Connect, retrying while the server is still starting (connection refused). */
static int connect_server(const struct options* o) {
  struct sockaddr_in address;
  memset(&address, 0, sizeof address);
  address.sin_family = AF_INET;
  address.sin_port = htons((uint16_t)o->port);
  if (inet_pton(AF_INET, o->host, &address.sin_addr) != 1) {
    fprintf(stderr, "lru_client: not an IPv4 address: %s\n", o->host);
    exit(1);
  }
  double deadline = now_seconds() + o->connect_timeout;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      perror("lru_client: socket");
      exit(1);
    }
    if (connect(fd, (struct sockaddr*)&address, sizeof address) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    int error = errno;
    close(fd);
    if ((error != ECONNREFUSED && error != EINTR) || now_seconds() >= deadline) {
      fprintf(stderr, "lru_client: cannot connect to %s:%d: %s\n", o->host, o->port,
              strerror(error));
      exit(1);
    }
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
}

static void write_all(int fd, const char* data, size_t length) {
  while (length) {
    ssize_t n = write(fd, data, length);
    if (n < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "lru_client: write: %s\n", strerror(errno));
      exit(2);
    }
    data += n;
    length -= (size_t)n;
  }
}

/* Replies are read into this buffer; a reply can straddle two reads. */
static char reply_buffer[REPLY_BUFFER];
static size_t reply_start, reply_end;

/* Keeps the unread replies at the front of the buffer and reads more; exits when the server
 * closes the connection. */
static void read_more(int fd) {
  memmove(reply_buffer, reply_buffer + reply_start, reply_end - reply_start);
  reply_end -= reply_start;
  reply_start = 0;
  if (reply_end == sizeof reply_buffer) {
    fprintf(stderr, "lru_client: a reply longer than %zu bytes\n", sizeof reply_buffer);
    exit(2);
  }
  for (;;) {
    ssize_t n = read(fd, reply_buffer + reply_end, sizeof reply_buffer - reply_end);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fprintf(stderr, "lru_client: the server closed the connection (%s)\n",
              n < 0 ? strerror(errno) : "EOF");
      exit(2);
    }
    reply_end += (size_t)n;
    return;
  }
}

/* Reads `count` replies: one-line replies to SET, or with `bulk` the bulk strings GET answers
 * (whose hits are added to *hits). Returns how many were errors. */
static long read_replies(int fd, long count, int bulk, long* hits) {
  long errors = 0;
  while (count > 0) {
    char* line_end = memchr(reply_buffer + reply_start, '\n', reply_end - reply_start);
    if (line_end && bulk && reply_buffer[reply_start] == '$') {
      long length = strtol(reply_buffer + reply_start + 1, NULL, 10);
      size_t whole = (size_t)(line_end - reply_buffer) + 1 + (length >= 0 ? (size_t)length + 2 : 0);
      if (whole > reply_end) {
        read_more(fd);
        continue;
      }
      if (length >= 0) (*hits)++;
      reply_start = whole;
      count--;
      continue;
    }
    if (line_end) {
      char type = reply_buffer[reply_start];
      if (type == '-') {
        if (errors == 0) {
          /* Show the first error of a batch: OOM would mean eviction could not keep up. */
          fprintf(stderr, "lru_client: server error: %.*s\n",
                  (int)(line_end - (reply_buffer + reply_start)), reply_buffer + reply_start);
        }
        errors++;
      } else if (type != '+' || bulk) {
        fprintf(stderr, "lru_client: unexpected reply to %s: %.*s\n", bulk ? "GET" : "SET",
                (int)(line_end - (reply_buffer + reply_start)), reply_buffer + reply_start);
        exit(2);
      }
      reply_start = (size_t)(line_end - reply_buffer) + 1;
      count--;
      continue;
    }
    read_more(fd); /* no complete line yet */
  }
  return errors;
}

static const char hex[] = "0123456789abcdef";

/* Writes "key:<16 hex digits>" at p; returns the end. */
static char* put_key(char* p, uint64_t key) {
  memcpy(p, "key:", 4);
  p += 4;
  for (int digit = KEY_HEX_DIGITS - 1; digit >= 0; digit--)
    p[KEY_HEX_DIGITS - 1 - digit] = hex[(key >> (4 * digit)) & 15];
  return p + KEY_HEX_DIGITS;
}

static void* allocate(size_t bytes) {
  void* memory = malloc(bytes);
  if (!memory) {
    fprintf(stderr, "lru_client: out of memory\n");
    exit(1);
  }
  return memory;
}

/* --rate: the keys sent so far, against the time since the first batch. */
struct pacer {
  long rate; /* keys per second; 0: no pacing */
  double start;
  long sent;
};

/* Waits until the next `keys` are due. */
static void pace(struct pacer* pacer, long keys) {
  if (pacer->rate <= 0) return;
  double now = now_seconds();
  if (pacer->sent == 0) pacer->start = now;
  double due = pacer->start + (double)pacer->sent / (double)pacer->rate;
  if (due > now) {
    double wait = due - now;
    struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  pacer->sent += keys;
}

/* Runs one phase; returns its wall-clock seconds and adds its error replies to *errors. */
static double run_phase(int fd, long keys, long value_size, long batch, const char* pool,
                        uint64_t* inserted, struct pacer* pacer, long* errors) {
  /* One command: *3 $3 SET $20 key:<16 hex> $<n> <value>, with CRLFs; 64 bytes cover the headers.
   */
  size_t command_max = (size_t)value_size + 4 + KEY_HEX_DIGITS + 64;
  char* buffer = allocate(command_max * (size_t)batch);
  char header[64];
  int header_length =
      snprintf(header, sizeof header, "*3\r\n$3\r\nSET\r\n$%d\r\n", 4 + KEY_HEX_DIGITS);
  char value_header[32];
  int value_header_length = snprintf(value_header, sizeof value_header, "\r\n$%ld\r\n", value_size);
  double start = now_seconds();
  for (long done = 0; done < keys;) {
    long n = keys - done < batch ? keys - done : batch;
    char* p = buffer;
    for (long i = 0; i < n; i++) {
      uint64_t key = next_random();
      if (inserted) inserted[done + i] = key;
      memcpy(p, header, (size_t)header_length);
      p += header_length;
      p = put_key(p, key);
      memcpy(p, value_header, (size_t)value_header_length);
      p += value_header_length;
      /* The value: value_size bytes of the pool from an offset taken from the key. */
      long offset = (long)(key % (uint64_t)(VALUE_POOL - (value_size % VALUE_POOL)));
      for (long copied = 0; copied < value_size;) {
        long chunk = value_size - copied;
        if (chunk > VALUE_POOL - offset) chunk = VALUE_POOL - offset;
        memcpy(p + copied, pool + offset, (size_t)chunk);
        copied += chunk;
        offset = 0;
      }
      p += value_size;
      *p++ = '\r';
      *p++ = '\n';
    }
    pace(pacer, n);
    write_all(fd, buffer, (size_t)(p - buffer));
    *errors += read_replies(fd, n, 0, NULL);
    done += n;
  }
  double seconds = now_seconds() - start;
  free(buffer);
  return seconds;
}

/* The read phase: `reads` GETs of keys drawn from `inserted`; returns its seconds. */
static double run_reads(int fd, const uint64_t* inserted, long count, long reads, long batch,
                        long* hits, long* errors) {
  char* buffer = allocate((4 + KEY_HEX_DIGITS + 64) * (size_t)batch);
  char header[64];
  int header_length =
      snprintf(header, sizeof header, "*2\r\n$3\r\nGET\r\n$%d\r\n", 4 + KEY_HEX_DIGITS);
  double start = now_seconds();
  for (long done = 0; done < reads;) {
    long n = reads - done < batch ? reads - done : batch;
    char* p = buffer;
    for (long i = 0; i < n; i++) {
      memcpy(p, header, (size_t)header_length);
      p += header_length;
      p = put_key(p, inserted[next_random() % (uint64_t)count]);
      *p++ = '\r';
      *p++ = '\n';
    }
    write_all(fd, buffer, (size_t)(p - buffer));
    *errors += read_replies(fd, n, 1, hits);
    done += n;
  }
  double seconds = now_seconds() - start;
  free(buffer);
  return seconds;
}

int main(int argc, char** argv) {
  struct options o;
  parse_options(argc, argv, &o);
  rng_state = o.seed;

  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static char pool[VALUE_POOL];
  for (int i = 0; i < VALUE_POOL; i++) pool[i] = alphabet[next_random() % (sizeof alphabet - 1)];

  /* The keys inserted, for the read phase to draw from. */
  long total_keys = o.phase_keys[0] + o.phase_keys[1];
  uint64_t* inserted = NULL;
  if (o.reads > 0 && total_keys > 0) {
    inserted = allocate(sizeof *inserted * (size_t)total_keys);
  }

  int fd = connect_server(&o);
  long errors = 0;
  double seconds[2];
  struct pacer pacer = {o.rate, 0.0, 0};
  for (int phase = 0; phase < 2; phase++)
    seconds[phase] =
        run_phase(fd, o.phase_keys[phase], o.value_size[phase], o.batch, pool,
                  inserted ? inserted + (phase ? o.phase_keys[0] : 0) : NULL, &pacer, &errors);
  long hits = 0;
  double read_seconds = 0;
  if (inserted)
    read_seconds = run_reads(fd, inserted, total_keys, o.reads, o.batch, &hits, &errors);
  close(fd);

  printf(
      "lru_client phase1_keys=%ld phase1_value=%ld phase1_s=%.6f phase2_keys=%ld phase2_value=%ld "
      "phase2_s=%.6f total_s=%.6f errors=%ld batch=%ld seed=%llu",
      o.phase_keys[0], o.value_size[0], seconds[0], o.phase_keys[1], o.value_size[1], seconds[1],
      seconds[0] + seconds[1], errors, o.batch, (unsigned long long)o.seed);
  if (inserted) printf(" reads=%ld reads_s=%.6f hits=%ld", o.reads, read_seconds, hits);
  printf("\n");
  free(inserted);
  return 0;
}
