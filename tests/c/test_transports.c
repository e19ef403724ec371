/* Test transports written in C, as an application would write its own. */
#include <stdint.h>
#include <time.h>

#include "test_util.h"

void test_transport_init(test_transport *t) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cond, NULL);
}

void test_transport_open(test_transport *t) {
  pthread_mutex_lock(&t->mu);
  t->open = 1;
  pthread_cond_broadcast(&t->cond);
  pthread_mutex_unlock(&t->mu);
}

static void log_event(test_transport *t, char ev) {
  if (t->nevents < (int)sizeof t->events - 1) t->events[t->nevents++] = ev;
}

static void count_free(void *ud) {
  test_transport *t = ud;
  pthread_mutex_lock(&t->mu);
  t->freed_user_data++;
  pthread_mutex_unlock(&t->mu);
}

static uint64_t nbytes_of(const rdt_tensor *t) {
  uint64_t n = (uint64_t)(t->dtype.bits * t->dtype.lanes + 7) / 8;
  for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
  return n;
}

/* Metadata: the address of each source tensor. */
static rdt_status extract_addresses(void *ud, const char *oid,
                                    const rdt_tensor *ts, size_t n,
                                    rdt_buffer *out) {
  test_transport *t = ud;
  (void)oid;
  pthread_mutex_lock(&t->mu);
  t->extracts++;
  pthread_mutex_unlock(&t->mu);
  uintptr_t addrs[64];
  if (n > 64) return RDT_ERR_UNSUPPORTED;
  for (size_t i = 0; i < n; i++) addrs[i] = (uintptr_t)ts[i].data;
  return rdt_buffer_set(out, addrs, n * sizeof addrs[0]);
}

static void gc_count(void *ud, const char *oid, const rdt_tensor *ts, size_t n,
                     const void *tm, size_t tms) {
  test_transport *t = ud;
  (void)oid, (void)ts, (void)n, (void)tm, (void)tms;
  pthread_mutex_lock(&t->mu);
  t->gcs++;
  pthread_mutex_unlock(&t->mu);
}

static rdt_status comm_meta(void *ud, const rdt_transfer *x, rdt_buffer *out) {
  test_transport *t = ud;
  pthread_mutex_lock(&t->mu);
  t->comms++;
  pthread_mutex_unlock(&t->mu);
  return rdt_buffer_set(out, &x->transfer_id, sizeof x->transfer_id);
}

/* Blocks while gated; returns RDT_ERR_ABORTED if aborted meanwhile. Called
 * with t->mu held. `aborted` points at the transfer's abort flag. */
static rdt_status gate_locked(test_transport *t, const int *aborted) {
  while (t->gated && !t->open && !*aborted) pthread_cond_wait(&t->cond, &t->mu);
  return *aborted ? RDT_ERR_ABORTED : RDT_OK;
}

/* Counts one more recv/wait; fails it if it is the configured one. */
static rdt_status maybe_fail_locked(test_transport *t, int nth) {
  if (t->fail_at && nth == t->fail_at) {
    rdt_set_error(t->fail_message);
    return t->fail_status;
  }
  return RDT_OK;
}

static void copy_from_addresses(const rdt_tensor *targets, size_t n,
                                const void *tm) {
  const uintptr_t *addrs = tm;
  for (size_t i = 0; i < n; i++)
    memcpy(targets[i].data, (const void *)addrs[i], nbytes_of(&targets[i]));
}

/* Where target (or source) i of a transfer lies at the source's (or the
 * owner's) addresses: tensor i, or ranges[i] of a partial transfer. NULL
 * when the range does not fit the published tensors. */
static char *address_of(const rdt_transfer *x, size_t i, const uintptr_t *addrs,
                        size_t num_addrs, uint64_t nbytes) {
  if (x->ranges == NULL) return i < num_addrs ? (char *)addrs[i] : NULL;
  if (i >= x->num_ranges) return NULL;
  const rdt_range *r = &x->ranges[i];
  if (r->tensor >= num_addrs || r->length != nbytes) return NULL;
  return (char *)addrs[r->tensor] + r->offset;
}

/* ---- memcopy: synchronous recv --------------------------------------- */

static rdt_status memcopy_recv(void *ud, const rdt_transfer *x,
                               const rdt_tensor *targets, size_t n,
                               const void *tm, size_t tms, const void *cm,
                               size_t cms) {
  test_transport *t = ud;
  static const int never = 0;
  if (cms != sizeof x->transfer_id || memcmp(cm, &x->transfer_id, cms) != 0) {
    rdt_set_error("communicator metadata did not arrive");
    return RDT_ERR_TRANSPORT;
  }
  if (x->ranges == NULL ? tms != n * sizeof(uintptr_t) : tms % sizeof(uintptr_t) != 0) {
    rdt_set_error("transport metadata has the wrong size");
    return RDT_ERR_TRANSPORT;
  }
  pthread_mutex_lock(&t->mu);
  int nth = ++t->recvs;
  rdt_status st = maybe_fail_locked(t, nth);
  if (st == RDT_OK) st = gate_locked(t, &never);
  pthread_mutex_unlock(&t->mu);
  if (st != RDT_OK) return st;
  if (x->ranges == NULL) {
    copy_from_addresses(targets, n, tm);
    return RDT_OK;
  }
  for (size_t i = 0; i < n; i++) {
    const char *from = address_of(x, i, tm, tms / sizeof(uintptr_t), nbytes_of(&targets[i]));
    if (from == NULL) {
      rdt_set_error("a range does not fit the source's tensors");
      return RDT_ERR_INVALID_ARGUMENT;
    }
    memcpy(targets[i].data, from, nbytes_of(&targets[i]));
  }
  return RDT_OK;
}

rdt_transport_vtable memcopy_vtable(test_transport *t) {
  rdt_transport_vtable vt;
  rdt_transport_vtable_init(&vt);
  vt.flags = RDT_TRANSPORT_ONE_SIDED;
  vt.user_data = t;
  vt.free_user_data = count_free;
  vt.extract_metadata = extract_addresses;
  vt.communicator_metadata = comm_meta;
  vt.recv = memcopy_recv;
  vt.garbage_collect = gc_count;
  return vt;
}

/* ---- memcopy that writes ----------------------------------------------- */

static rdt_status memcopy_write(void *ud, const rdt_transfer *x,
                                const rdt_tensor *sources, size_t n,
                                const void *tm, size_t tms, const void *cm,
                                size_t cms) {
  test_transport *t = ud;
  if (x->role != RDT_ROLE_SOURCE) {
    rdt_set_error("a write runs on the writer, the transfer's source");
    return RDT_ERR_INTERNAL;
  }
  if (cms != sizeof x->transfer_id || memcmp(cm, &x->transfer_id, cms) != 0) {
    rdt_set_error("communicator metadata did not arrive");
    return RDT_ERR_TRANSPORT;
  }
  if (tms == 0 || tms % sizeof(uintptr_t) != 0) {
    rdt_set_error("the owner's metadata has the wrong size");
    return RDT_ERR_TRANSPORT;
  }
  pthread_mutex_lock(&t->mu);
  int nth = ++t->writes;
  rdt_status st = maybe_fail_locked(t, nth);
  if (st == RDT_OK && t->gated) {
    log_event(t, 'W');
    pthread_cond_broadcast(&t->cond);
    st = gate_locked(t, &t->write_aborted);
    if (st != RDT_OK) rdt_set_error("write aborted before any byte moved");
  }
  pthread_mutex_unlock(&t->mu);
  if (st != RDT_OK) return st;
  for (size_t i = 0; i < n; i++) {
    char *to = address_of(x, i, tm, tms / sizeof(uintptr_t), nbytes_of(&sources[i]));
    if (to == NULL) {
      rdt_set_error("a source does not fit the owner's tensors");
      return RDT_ERR_INVALID_ARGUMENT;
    }
    memcpy(to, sources[i].data, nbytes_of(&sources[i]));
  }
  return RDT_OK;
}

static rdt_status memcopy_write_abort(void *ud, const rdt_transfer *x, void *request) {
  test_transport *t = ud;
  (void)x, (void)request;
  pthread_mutex_lock(&t->mu);
  t->aborts++;
  t->write_aborted = 1;
  pthread_cond_broadcast(&t->cond);
  pthread_mutex_unlock(&t->mu);
  return RDT_OK;
}

rdt_transport_vtable memcopy_write_vtable(test_transport *t) {
  rdt_transport_vtable vt = memcopy_vtable(t);
  vt.flags |= RDT_TRANSPORT_WRITES | RDT_TRANSPORT_RANGES | RDT_TRANSPORT_CAN_ABORT;
  vt.write = memcopy_write;
  vt.abort = memcopy_write_abort;
  return vt;
}

/* ---- async: fetch/wait/release_request -------------------------------- */

typedef struct async_req {
  const rdt_tensor *targets; /* valid until release_request */
  size_t n;
  uintptr_t addrs[64];
  int aborted;
  int done;
} async_req;

static rdt_status async_fetch(void *ud, const rdt_transfer *x,
                              const rdt_tensor *targets, size_t n,
                              const void *tm, size_t tms, const void *cm,
                              size_t cms, void **request) {
  test_transport *t = ud;
  (void)x, (void)cm, (void)cms;
  if (n > 64 || tms != n * sizeof(uintptr_t)) return RDT_ERR_TRANSPORT;
  async_req *r = calloc(1, sizeof *r);
  if (r == NULL) return RDT_ERR_NO_MEMORY;
  r->targets = targets;
  r->n = n;
  memcpy(r->addrs, tm, tms);
  pthread_mutex_lock(&t->mu);
  t->fetches++;
  log_event(t, 'f');
  pthread_mutex_unlock(&t->mu);
  *request = r;
  return RDT_OK;
}

static rdt_status async_wait(void *ud, void *request, int64_t timeout_ms) {
  test_transport *t = ud;
  async_req *r = request;
  (void)timeout_ms;
  pthread_mutex_lock(&t->mu);
  int nth = ++t->waits;
  log_event(t, 'w');
  rdt_status st = maybe_fail_locked(t, nth);
  if (st == RDT_OK) st = gate_locked(t, &r->aborted);
  pthread_mutex_unlock(&t->mu);
  if (st != RDT_OK) return st;
  copy_from_addresses(r->targets, r->n, r->addrs);
  r->done = 1;
  return RDT_OK;
}

static void async_release(void *ud, void *request) {
  test_transport *t = ud;
  pthread_mutex_lock(&t->mu);
  t->releases++;
  pthread_mutex_unlock(&t->mu);
  free(request);
}

static rdt_status async_abort(void *ud, const rdt_transfer *x, void *request) {
  test_transport *t = ud;
  (void)x;
  pthread_mutex_lock(&t->mu);
  t->aborts++;
  if (request) ((async_req *)request)->aborted = 1;
  pthread_cond_broadcast(&t->cond);
  pthread_mutex_unlock(&t->mu);
  return RDT_OK;
}

rdt_transport_vtable async_vtable(test_transport *t) {
  rdt_transport_vtable vt;
  rdt_transport_vtable_init(&vt);
  vt.flags = RDT_TRANSPORT_ONE_SIDED | RDT_TRANSPORT_CAN_ABORT;
  vt.user_data = t;
  vt.free_user_data = count_free;
  vt.extract_metadata = extract_addresses;
  vt.fetch = async_fetch;
  vt.wait = async_wait;
  vt.release_request = async_release;
  vt.abort = async_abort;
  vt.garbage_collect = gc_count;
  return vt;
}

/* ---- mailbox: two-sided ------------------------------------------------ */

#define MAILBOX_SLOTS 256

typedef struct mail {
  uint64_t transfer_id;
  void *data;
  size_t size;
  int full, aborted, used;
} mail;

static pthread_mutex_t mailbox_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t mailbox_cond = PTHREAD_COND_INITIALIZER;
static mail mailbox[MAILBOX_SLOTS];

/* The slot of a transfer, claimed on first use. Caller holds mailbox_mu. */
static mail *slot_locked(uint64_t id) {
  mail *free_slot = NULL;
  for (int i = 0; i < MAILBOX_SLOTS; i++) {
    if (mailbox[i].used && mailbox[i].transfer_id == id) return &mailbox[i];
    if (!mailbox[i].used && free_slot == NULL) free_slot = &mailbox[i];
  }
  if (free_slot) {
    memset(free_slot, 0, sizeof *free_slot);
    free_slot->used = 1;
    free_slot->transfer_id = id;
  }
  return free_slot;
}

static rdt_status mailbox_send(void *ud, const rdt_transfer *x,
                               const rdt_tensor *ts, size_t n, const void *tm,
                               size_t tms, const void *cm, size_t cms) {
  test_transport *t = ud;
  (void)tm, (void)tms;
  if (x->role != RDT_ROLE_SOURCE) return RDT_ERR_INTERNAL;
  if (cms != sizeof x->transfer_id || memcmp(cm, &x->transfer_id, cms) != 0) {
    rdt_set_error("communicator metadata did not reach the source");
    return RDT_ERR_TRANSPORT;
  }
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += nbytes_of(&ts[i]);
  char *data = malloc(total ? total : 1);
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    memcpy(data + off, ts[i].data, nbytes_of(&ts[i]));
    off += nbytes_of(&ts[i]);
  }
  pthread_mutex_lock(&t->mu);
  t->sends++;
  t->send_thread = pthread_self();
  pthread_mutex_unlock(&t->mu);
  pthread_mutex_lock(&mailbox_mu);
  mail *m = slot_locked(x->transfer_id);
  if (m == NULL || m->aborted) {
    pthread_mutex_unlock(&mailbox_mu);
    free(data);
    rdt_set_error(m ? "aborted" : "mailbox full");
    return m ? RDT_ERR_ABORTED : RDT_ERR_TRANSPORT;
  }
  m->data = data;
  m->size = total;
  m->full = 1;
  pthread_cond_broadcast(&mailbox_cond);
  pthread_mutex_unlock(&mailbox_mu);
  return RDT_OK;
}

static rdt_status mailbox_recv(void *ud, const rdt_transfer *x,
                               const rdt_tensor *targets, size_t n,
                               const void *tm, size_t tms, const void *cm,
                               size_t cms) {
  test_transport *t = ud;
  (void)tm, (void)tms, (void)cm, (void)cms;
  pthread_mutex_lock(&t->mu);
  int nth = ++t->recvs;
  rdt_status st = maybe_fail_locked(t, nth);
  pthread_mutex_unlock(&t->mu);
  if (st != RDT_OK) return st;
  pthread_mutex_lock(&mailbox_mu);
  mail *m = slot_locked(x->transfer_id);
  while (m && !m->full && !m->aborted) pthread_cond_wait(&mailbox_cond, &mailbox_mu);
  if (m == NULL || m->aborted) {
    if (m) m->used = 0;
    pthread_mutex_unlock(&mailbox_mu);
    rdt_set_error("receive aborted");
    return RDT_ERR_ABORTED;
  }
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    memcpy(targets[i].data, (char *)m->data + off, nbytes_of(&targets[i]));
    off += nbytes_of(&targets[i]);
  }
  free(m->data);
  m->used = 0;
  pthread_mutex_unlock(&mailbox_mu);
  return RDT_OK;
}

static rdt_status mailbox_abort(void *ud, const rdt_transfer *x, void *req) {
  test_transport *t = ud;
  (void)req;
  pthread_mutex_lock(&t->mu);
  t->aborts++;
  pthread_mutex_unlock(&t->mu);
  pthread_mutex_lock(&mailbox_mu);
  mail *m = slot_locked(x->transfer_id);
  if (m) m->aborted = 1;
  pthread_cond_broadcast(&mailbox_cond);
  pthread_mutex_unlock(&mailbox_mu);
  return RDT_OK;
}

rdt_transport_vtable mailbox_vtable(test_transport *t) {
  rdt_transport_vtable vt;
  rdt_transport_vtable_init(&vt);
  vt.flags = RDT_TRANSPORT_CAN_ABORT; /* two-sided */
  vt.user_data = t;
  vt.free_user_data = count_free;
  vt.communicator_metadata = comm_meta;
  vt.send = mailbox_send;
  vt.recv = mailbox_recv;
  vt.abort = mailbox_abort;
  vt.garbage_collect = gc_count;
  return vt;
}
