/* Pure-C parts of the ABI: status names, versions, thread-local messages,
 * callback output buffers. None of this enters Go. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "capi.h"

static __thread char *last_error;
static __thread char *callback_error;

/* The thread-local strings are read through __thread (fast); pthread keys
 * hold the same pointers only so that a thread's strings are freed when
 * the thread exits. */
static pthread_key_t last_error_key, callback_error_key;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void make_keys(void) {
  pthread_key_create(&last_error_key, free);
  pthread_key_create(&callback_error_key, free);
}

static void set_callback_error(char *msg) {
  free(callback_error);
  callback_error = msg;
  pthread_once(&keys_once, make_keys);
  pthread_setspecific(callback_error_key, msg);
}

void rdtc_set_last_error(const char *msg, size_t len) {
  char *copy = malloc(len + 1);
  if (copy == NULL) return; /* keep the previous message rather than none */
  memcpy(copy, msg, len);
  copy[len] = '\0';
  free(last_error);
  last_error = copy;
  pthread_once(&keys_once, make_keys);
  pthread_setspecific(last_error_key, copy);
}

const char *rdt_last_error(void) { return last_error ? last_error : ""; }

const char *rdt_version(void) {
#define RDT_STR2(x) #x
#define RDT_STR(x) RDT_STR2(x)
  return RDT_STR(RDT_VERSION_MAJOR) "." RDT_STR(RDT_VERSION_MINOR) "." RDT_STR(
      RDT_VERSION_PATCH);
}

uint32_t rdt_abi_version(void) { return RDT_ABI_VERSION; }

const char *rdt_status_string(rdt_status status) {
  switch (status) {
#define RDT_STATUS_NAME_(name, value) \
  case name:                          \
    return #name;
    RDT_STATUS_LIST(RDT_STATUS_NAME_)
#undef RDT_STATUS_NAME_
  }
  return (int)status < (int)RDT_ERR_USER ? "RDT_ERR_USER" : "RDT_ERR_UNKNOWN";
}

void rdt_bytes_free(void *bytes) { free(bytes); }

rdt_status rdt_buffer_set(rdt_buffer *buf, const void *data, size_t size) {
  static const char null_buf[] = "rdt_buffer_set: buf is NULL";
  static const char null_data[] = "rdt_buffer_set: data is NULL but size > 0";
  if (buf == NULL) {
    rdtc_set_last_error(null_buf, sizeof null_buf - 1);
    return RDT_ERR_INVALID_ARGUMENT;
  }
  if (data == NULL && size > 0) {
    rdtc_set_last_error(null_data, sizeof null_data - 1);
    return RDT_ERR_INVALID_ARGUMENT;
  }
  void *copy = NULL;
  if (size > 0) {
    copy = malloc(size);
    if (copy == NULL) return RDT_ERR_NO_MEMORY;
    memcpy(copy, data, size);
  }
  free(buf->data);
  buf->data = copy;
  buf->size = size;
  return RDT_OK;
}

void rdt_set_error(const char *message) {
  set_callback_error(message ? strdup(message) : NULL);
}

/* ---- trampolines ---------------------------------------------------- */

static void cb_begin(void) { set_callback_error(NULL); }

/* Hands the callback's message (if any) to the caller on failure. */
static rdt_status cb_end(rdt_status st, char **err) {
  if (st != RDT_OK && err != NULL) {
    *err = callback_error; /* the caller frees it now */
    callback_error = NULL;
    pthread_setspecific(callback_error_key, NULL);
  } else {
    set_callback_error(NULL);
  }
  return st;
}

void rdtc_call_release(rdt_release_fn fn, uintptr_t user_data) {
  if (fn) fn((void *)user_data);
}

void rdtc_call_free_user_data(const rdt_transport_vtable *vt) {
  if (vt->free_user_data) vt->free_user_data(vt->user_data);
}

rdt_status rdtc_cb_extract(const rdt_transport_vtable *vt, const char *oid,
                           const rdt_tensor *ts, size_t n,
                           struct rdt_buffer *out, char **err) {
  cb_begin();
  return cb_end(vt->extract_metadata(vt->user_data, oid, ts, n, out), err);
}

rdt_status rdtc_cb_comm(const rdt_transport_vtable *vt, const rdt_transfer *x,
                        struct rdt_buffer *out, char **err) {
  cb_begin();
  return cb_end(vt->communicator_metadata(vt->user_data, x, out), err);
}

rdt_status rdtc_cb_send(const rdt_transport_vtable *vt, const rdt_transfer *x,
                        const rdt_tensor *ts, size_t n, const void *tm,
                        size_t tms, const void *cm, size_t cms, char **err) {
  cb_begin();
  return cb_end(vt->send(vt->user_data, x, ts, n, tm, tms, cm, cms), err);
}

rdt_status rdtc_cb_recv(const rdt_transport_vtable *vt, const rdt_transfer *x,
                        const rdt_tensor *ts, size_t n, const void *tm,
                        size_t tms, const void *cm, size_t cms, char **err) {
  cb_begin();
  return cb_end(vt->recv(vt->user_data, x, ts, n, tm, tms, cm, cms), err);
}

rdt_status rdtc_cb_fetch(const rdt_transport_vtable *vt, const rdt_transfer *x,
                         const rdt_tensor *ts, size_t n, const void *tm,
                         size_t tms, const void *cm, size_t cms, uintptr_t *req,
                         char **err) {
  void *request = NULL;
  cb_begin();
  rdt_status st = vt->fetch(vt->user_data, x, ts, n, tm, tms, cm, cms, &request);
  *req = (uintptr_t)request;
  return cb_end(st, err);
}

rdt_status rdtc_cb_write(const rdt_transport_vtable *vt, const rdt_transfer *x,
                         const rdt_tensor *ts, size_t n, const void *tm,
                         size_t tms, const void *cm, size_t cms, char **err) {
  cb_begin();
  return cb_end(vt->write(vt->user_data, x, ts, n, tm, tms, cm, cms), err);
}

rdt_status rdtc_cb_write_start(const rdt_transport_vtable *vt,
                               const rdt_transfer *x, const rdt_tensor *ts,
                               size_t n, const void *tm, size_t tms,
                               const void *cm, size_t cms, uintptr_t *req,
                               char **err) {
  void *request = NULL;
  cb_begin();
  rdt_status st =
      vt->write_start(vt->user_data, x, ts, n, tm, tms, cm, cms, &request);
  *req = (uintptr_t)request;
  return cb_end(st, err);
}

rdt_status rdtc_cb_wait(const rdt_transport_vtable *vt, uintptr_t req,
                        int64_t timeout_ms, char **err) {
  cb_begin();
  return cb_end(vt->wait(vt->user_data, (void *)req, timeout_ms), err);
}

void rdtc_cb_release_request(const rdt_transport_vtable *vt, uintptr_t req) {
  vt->release_request(vt->user_data, (void *)req);
}

void rdtc_cb_gc(const rdt_transport_vtable *vt, const char *oid,
                const rdt_tensor *ts, size_t n, const void *tm, size_t tms) {
  if (vt->garbage_collect) vt->garbage_collect(vt->user_data, oid, ts, n, tm, tms);
}

rdt_status rdtc_cb_abort(const rdt_transport_vtable *vt, const rdt_transfer *x,
                         uintptr_t req, char **err) {
  cb_begin();
  return cb_end(vt->abort(vt->user_data, x, (void *)req), err);
}
