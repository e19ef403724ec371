/* Log capture: with rdt_log_capture on, a runtime's lines are held for
 * rdt_log_take instead of written to stderr; the level override reaches
 * every runtime; records honour the caller's struct_size as the stride. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"

/* The record as a caller built against an older, shorter header sees it. */
typedef struct short_record {
  uint32_t struct_size;
  int32_t level;
  int64_t unix_ns;
} short_record;

static rdt_runtime *runtime_at(const char *name, int32_t level) {
  rdt_runtime_options opts;
  rdt_runtime_options_init(&opts);
  opts.name = name;
  opts.log_level = level;
  opts.flags = RDT_RUNTIME_IN_PROCESS | RDT_RUNTIME_NO_BUILTIN_TRANSPORTS;
  rdt_runtime *rt = NULL;
  CHECK_OK(rdt_runtime_create(&opts, &rt));
  return rt;
}

/* Takes what is held (without waiting) into recs; returns the count. */
static size_t take_all(rdt_log_record *recs, size_t cap) {
  for (size_t i = 0; i < cap; i++) rdt_log_record_init(&recs[i]);
  size_t n = 99;
  CHECK_OK(rdt_log_take(recs, cap, &n, 0));
  return n;
}

static int has_line(const rdt_log_record *recs, size_t n, const char *runtime,
                    int32_t level, const char *substr) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(recs[i].runtime, runtime) == 0 && recs[i].level == level &&
        strstr(recs[i].message, substr) != NULL)
      return 1;
  return 0;
}

static rdt_log_record recs[256];

int main(void) {
  size_t n = 0;
  rdt_log_record_init(&recs[0]);
  /* Off: nothing to take. */
  CHECK_STATUS(rdt_log_take(recs, 1, &n, 0), RDT_ERR_CLOSED);
  CHECK_OK(rdt_log_capture(1));
  CHECK_OK(rdt_log_capture(1)); /* twice is fine */

  /* Bad arguments. */
  rdt_log_record_init(&recs[0]);
  CHECK_STATUS(rdt_log_take(recs, 0, &n, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_log_take(recs, 1, NULL, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_log_take(NULL, 1, &n, 0), RDT_ERR_INVALID_ARGUMENT);
  recs[0].struct_size = 2;
  CHECK_STATUS(rdt_log_take(recs, 1, &n, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("struct_size");
  CHECK_STATUS(rdt_log_set_level(RDT_LOG_DEBUG + 1), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_log_set_level(-1), RDT_ERR_INVALID_ARGUMENT);

  /* A debug runtime's lines are held, with its name, level and time. */
  rdt_runtime *loud = runtime_at("loud", RDT_LOG_DEBUG);
  n = take_all(recs, 256);
  CHECK(n >= 1);
  CHECK(has_line(recs, n, "loud", RDT_LOG_DEBUG, "listening"));
  CHECK(recs[0].unix_ns > 1600000000LL * 1000000000LL);
  CHECK_OK(rdt_runtime_destroy(loud));
  CHECK(has_line(recs, take_all(recs, 256), "loud", RDT_LOG_DEBUG, "destroyed"));

  /* Empty: a bounded wait returns no lines and no error. */
  CHECK_OK(rdt_log_take(recs, 4, &n, 30));
  CHECK(n == 0);

  /* A warn runtime says nothing at debug until the override raises it;
   * a silent one stays silent. */
  rdt_runtime *quiet = runtime_at("quiet", RDT_LOG_WARN);
  rdt_runtime *off = runtime_at("off", RDT_LOG_OFF);
  CHECK(take_all(recs, 256) == 0);
  CHECK_OK(rdt_log_set_level(RDT_LOG_DEBUG));
  CHECK_OK(rdt_runtime_destroy(quiet));
  CHECK_OK(rdt_runtime_destroy(off));
  n = take_all(recs, 256);
  CHECK(has_line(recs, n, "quiet", RDT_LOG_DEBUG, "destroyed"));
  for (size_t i = 0; i < n; i++) CHECK(strcmp(recs[i].runtime, "off") != 0);
  CHECK_OK(rdt_log_set_level(RDT_LOG_DEFAULT));

  /* A shorter record: the stride is its struct_size, and the bytes after
   * it are left alone. */
  rdt_runtime *again = runtime_at("again", RDT_LOG_DEBUG);
  CHECK_OK(rdt_runtime_destroy(again));
  short_record shorts[3];
  memset(shorts, 0xab, sizeof shorts);
  for (int i = 0; i < 2; i++) shorts[i].struct_size = sizeof shorts[0];
  CHECK_OK(rdt_log_take((rdt_log_record *)(void *)shorts, 2, &n, 0));
  CHECK(n == 2);
  CHECK(shorts[0].level == RDT_LOG_DEBUG && shorts[1].level == RDT_LOG_DEBUG);
  CHECK(shorts[1].unix_ns >= shorts[0].unix_ns);
  CHECK(shorts[2].struct_size == 0xabababab);

  /* Off again: held lines are dropped, takes fail. */
  CHECK_OK(rdt_log_capture(0));
  CHECK_STATUS(rdt_log_take(recs, 1, &n, 0), RDT_ERR_CLOSED);
  printf("test_log_capture: ok\n");
  return 0;
}
