/*
 * rdt.h — the C interface of rdt, a direct tensor transport.
 *
 * A process puts tensors into an rdt runtime where they already live (host or
 * device memory) and gets back a reference. A reference can be serialized to
 * bytes, sent to another process by any means, deserialized there and fetched:
 * the bytes move straight from the source's memory into the receiver's
 * buffers through a transport. Distributed reference counting decides when
 * the source may free the tensors.
 *
 * Conventions used throughout this header:
 *
 *  - Every fallible call returns an rdt_status: RDT_OK (0) or a negative
 *    error code. rdt_last_error() then gives a message for the calling thread.
 *  - Handles (rdt_runtime, rdt_ref, rdt_pending, rdt_prepared, rdt_view)
 *    are opaque. A NULL, stale, freed or bogus handle makes a call return
 *    RDT_ERR_INVALID_ARGUMENT; it never crashes the process.
 *  - Every function that hands out something to free says which call frees
 *    it; those free functions accept NULL.
 *  - Option and info structs begin with `struct_size`. Fill them with the
 *    matching *_init() function (static inline below, so that struct_size and
 *    RDT_ABI_VERSION are those of the header you compiled against). Fields are
 *    only ever appended; zero means "the default" for every option field.
 *  - Tensors are described DLPack-style (rdt_tensor has the layout of
 *    DLPack's DLTensor). Version 1 moves contiguous (row-major) tensors only.
 *  - Thread safety: every function may be called from any thread, on the same
 *    or different handles, concurrently. A handle must not be used after (or
 *    while) it is being freed or released by another thread; doing so returns
 *    RDT_ERR_INVALID_ARGUMENT at worst.
 *  - Timeouts are in milliseconds: a negative value waits forever, 0 never
 *    waits. With 0, a wait for something under way (rdt_pending_wait,
 *    rdt_write_notice_wait, rdt_wait_tensor_freed) polls it, and a call that
 *    would start a transfer with another runtime (rdt_get, rdt_write,
 *    rdt_prepared_run, rdt_view_open) returns RDT_ERR_TIMEOUT without
 *    starting anything, on every transport; on the runtime's own objects
 *    those complete. See docs/abi.md, "Timeouts".
 *  - fork(): the library runs a Go runtime, which does not survive fork() in
 *    the child. In a child forked after the library was loaded, every call
 *    returns RDT_ERR_FORKED. Create processes with fork+exec or spawn.
 */
#ifndef RDT_H
#define RDT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define RDT_API __attribute__((visibility("default")))
#else
#define RDT_API
#endif

/* Marks a name kept for programs written against an older rdt.h: it still
 * compiles and links, with a warning that names its replacement. See the
 * end of this header, and docs/abi.md, "Renamed names". */
#if defined(__GNUC__)
#define RDT_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define RDT_DEPRECATED(msg)
#endif

/* ------------------------------------------------------------------------- */
/* Versions                                                                  */
/* ------------------------------------------------------------------------- */

#define RDT_VERSION_MAJOR 0
#define RDT_VERSION_MINOR 1
#define RDT_VERSION_PATCH 0

/* Bumped whenever a struct or function in this header changes incompatibly.
 * rdt_runtime_create() refuses options built against another ABI version. */
#define RDT_ABI_VERSION 1

/* The library's version as "MAJOR.MINOR.PATCH". Static storage; never NULL. */
RDT_API const char *rdt_version(void);

/* The RDT_ABI_VERSION the library was built with. */
RDT_API uint32_t rdt_abi_version(void);

/* ------------------------------------------------------------------------- */
/* Status codes and errors                                                   */
/* ------------------------------------------------------------------------- */

/* Every status code, written once: X(name, value) per code. The rdt_status
 * enum below is generated from this list, and so is rdt_status_string(); the
 * library's build and the test suite check the Go core and the bindings
 * against it. Names and values never change: they are ABI. */
#define RDT_STATUS_LIST(X) \
  X(RDT_OK, 0)                     /* success                                 */ \
  X(RDT_ERR_INVALID_ARGUMENT, -1)  /* NULL/bogus handle or pointer, bad value */ \
  X(RDT_ERR_NOT_FOUND, -2)         /* unknown transport, object already freed */ \
  X(RDT_ERR_ALREADY_EXISTS, -3)    /* a transport of that name is registered  */ \
  X(RDT_ERR_TIMEOUT, -4)           /* the deadline passed; see each function  */ \
  X(RDT_ERR_ABORTED, -5)           /* the operation was aborted               */ \
  X(RDT_ERR_PEER_UNAVAILABLE, -6)  /* the other runtime is gone, unreachable  */ \
  X(RDT_ERR_CORRUPT, -7)           /* malformed bytes: a ref or a message     */ \
  X(RDT_ERR_UNSUPPORTED, -8)       /* not possible here (device, library...)  */ \
  X(RDT_ERR_PERMISSION_DENIED, -9) /* refused by the OS or by authentication  */ \
  X(RDT_ERR_TRANSPORT, -10)        /* a transport failed to move the bytes    */ \
  X(RDT_ERR_NO_MEMORY, -11)        /* an allocation failed, a limit per peer  */ \
  X(RDT_ERR_ABI_MISMATCH, -12)     /* header and library disagree             */ \
  X(RDT_ERR_FORKED, -13)           /* called in a child forked after loading  */ \
  X(RDT_ERR_CLOSED, -14)   /* the runtime was destroyed               */ \
  X(RDT_ERR_INTERNAL, -50)         /* a bug in rdt; the message says where    */ \
  X(RDT_ERR_USER, -100)            /* a transport callback failed; any code   */ \
                                   /* at or below it is a callback's own      */

#define RDT_STATUS_ENUMERATOR_(name, value) name = value,
typedef enum rdt_status { RDT_STATUS_LIST(RDT_STATUS_ENUMERATOR_) } rdt_status;
#undef RDT_STATUS_ENUMERATOR_

/* A short constant name for a status, such as "RDT_ERR_TIMEOUT". Unknown
 * codes give "RDT_ERR_UNKNOWN" (codes <= RDT_ERR_USER give "RDT_ERR_USER").
 * Static storage; never NULL. */
RDT_API const char *rdt_status_string(rdt_status status);

/* The detailed message of the last call on this thread that returned an
 * error, or "" if there was none. The string belongs to the library and stays
 * valid until the next rdt call on the same thread. Never NULL. */
RDT_API const char *rdt_last_error(void);

/* ------------------------------------------------------------------------- */
/* Tensors (layout-compatible with DLPack's DLDevice, DLDataType, DLTensor)  */
/* ------------------------------------------------------------------------- */

/* Device types: DLPack's DLDeviceType codes. */
#define RDT_DEVICE_CPU 1
#define RDT_DEVICE_CUDA 2
#define RDT_DEVICE_CUDA_HOST 3
#define RDT_DEVICE_ROCM 10
#define RDT_DEVICE_CUDA_MANAGED 13

/* Data type codes: DLPack's DLDataTypeCode. */
#define RDT_DTYPE_INT 0
#define RDT_DTYPE_UINT 1
#define RDT_DTYPE_FLOAT 2
#define RDT_DTYPE_OPAQUE_HANDLE 3
#define RDT_DTYPE_BFLOAT 4
#define RDT_DTYPE_COMPLEX 5
#define RDT_DTYPE_BOOL 6
#define RDT_DTYPE_FLOAT8_E3M4 7
#define RDT_DTYPE_FLOAT8_E4M3 8
#define RDT_DTYPE_FLOAT8_E4M3B11FNUZ 9
#define RDT_DTYPE_FLOAT8_E4M3FN 10
#define RDT_DTYPE_FLOAT8_E4M3FNUZ 11
#define RDT_DTYPE_FLOAT8_E5M2 12
#define RDT_DTYPE_FLOAT8_E5M2FNUZ 13
#define RDT_DTYPE_FLOAT8_E8M0FNU 14
#define RDT_DTYPE_FLOAT6_E2M3FN 15
#define RDT_DTYPE_FLOAT6_E3M2FN 16
#define RDT_DTYPE_FLOAT4_E2M1FN 17

/* The most dimensions a tensor may have. */
#define RDT_MAX_NDIM 64

typedef struct rdt_device {
  int32_t device_type; /* RDT_DEVICE_* */
  int32_t device_id;   /* 0 for host memory */
} rdt_device;

typedef struct rdt_dtype {
  uint8_t code;   /* RDT_DTYPE_* */
  uint8_t bits;   /* bits per lane: 8, 16, 32, 64, ... */
  uint16_t lanes; /* 1 for scalars */
} rdt_dtype;

/* A tensor: where its bytes are, its shape, dtype and device. It describes
 * memory the caller owns: the library never frees anything it points to.
 * Its size in bytes is prod(shape) * ceil(bits * lanes / 8). `strides` is
 * NULL or, in elements, must describe the compact row-major layout; anything
 * else is RDT_ERR_INVALID_ARGUMENT. `data` may be NULL only for empty
 * tensors. The bytes start at (char *)data + byte_offset. */
typedef struct rdt_tensor {
  void *data;
  rdt_device device;
  int32_t ndim;
  rdt_dtype dtype;
  const int64_t *shape;   /* ndim entries, each >= 0; may be NULL if ndim 0 */
  const int64_t *strides; /* NULL, or ndim entries */
  uint64_t byte_offset;
} rdt_tensor;

/* ------------------------------------------------------------------------- */
/* Runtimes                                                                  */
/* ------------------------------------------------------------------------- */

typedef struct rdt_runtime rdt_runtime;
typedef struct rdt_ref rdt_ref;
typedef struct rdt_pending rdt_pending;

#define RDT_LOG_DEFAULT 0 /* RDT_LOG from the environment, else "warn" */
#define RDT_LOG_OFF 1
#define RDT_LOG_ERROR 2
#define RDT_LOG_WARN 3
#define RDT_LOG_INFO 4
#define RDT_LOG_DEBUG 5

/* Runtime flags. */
/* Keep the runtime inside this process: peers are other runtimes of the same
 * process only, reached without sockets. */
#define RDT_RUNTIME_IN_PROCESS (1u << 0)
/* Create the runtime without the built-in transports (cma, shm, tcp, ...);
 * only transports registered later are available. */
#define RDT_RUNTIME_NO_BUILTIN_TRANSPORTS (1u << 1)
/* Never call put's release callback on rdt's threads: queue the user data of
 * each freed object instead, for the application to take with
 * rdt_runtime_take_released() on a thread of its choosing. For bindings
 * whose callbacks are costly to enter from a foreign thread (an interpreter
 * lock), and for event loops. rdt_put() then takes release == NULL. */
#define RDT_RUNTIME_QUEUE_RELEASES (1u << 2)

typedef struct rdt_runtime_options {
  uint32_t struct_size; /* sizeof(rdt_runtime_options); set by _init */
  uint32_t abi_version; /* RDT_ABI_VERSION; set by _init */
  /* A name for log lines, copied. NULL: "rdt-<pid>". */
  const char *name;
  /* RDT_LOG_*. */
  int32_t log_level;
  /* RDT_RUNTIME_* flags. */
  uint32_t flags;
  /* How long a serialized reference keeps its object alive while it has not
   * been deserialized. 0: 120000 (two minutes). */
  int64_t lease_ms;
  /* How long a peer may stay silent, or leave a ping unanswered (it stopped
   * reading), before it counts as gone: its borrows are dropped and fetches
   * from it fail with RDT_ERR_PEER_UNAVAILABLE. A tcp receiver that stops reading for as long
   * is dropped too, so it pins the object no longer. 0: 5000. */
  int64_t peer_timeout_ms;
  /* Also listen for peers on TCP at "host:port" (port 0: any free port), so
   * that runtimes on other hosts can fetch from this one. NULL: $RDT_LISTEN,
   * else Unix socket only (same-host peers). A non-loopback host needs an
   * auth token. */
  const char *listen_tcp;
  /* Shared secret that TCP peers must prove (challenge-response, never sent
   * in clear). NULL: $RDT_AUTH_TOKEN. Without one, TCP binds loopback only,
   * and peers must prove this runtime's own random secret instead, which
   * they learn only from its address (see rdt_runtime_address). */
  const char *auth_token;
  /* Host name or IP that peers on other hosts dial. NULL: the listen host,
   * or this host's name when listening on a wildcard address. */
  const char *advertise_host;
  /* Directory for Unix sockets; created 0700 and must belong to this user.
   * NULL: $XDG_RUNTIME_DIR/rdt, else <tmp>/rdt-<uid>. */
  const char *socket_dir;
  /* Overrides the host identity that decides whether same-host transports
   * apply (boot id and namespaces by default). For tests that simulate
   * several hosts on one machine. NULL: detected. */
  const char *host_id;
} rdt_runtime_options;

/* Fills `opts` with defaults for this header's version. */
static inline void rdt_runtime_options_init(rdt_runtime_options *opts) {
  memset(opts, 0, sizeof *opts);
  opts->struct_size = (uint32_t)sizeof *opts;
  opts->abi_version = RDT_ABI_VERSION;
}

/* Creates a runtime. `opts` may be NULL for defaults; it is only read during
 * the call. On success *out is a new runtime that the caller destroys with
 * rdt_runtime_destroy(). Errors: INVALID_ARGUMENT (out NULL, struct_size too
 * small, an RDT_* environment variable out of bounds: the message names it;
 * docs/configuration.md lists them), ABI_MISMATCH (opts built against
 * another RDT_ABI_VERSION). */
RDT_API rdt_status rdt_runtime_create(const rdt_runtime_options *opts,
                                      rdt_runtime **out);

/* Destroys a runtime: aborts its fetches and waits until no transfer can
 * write into their targets, frees every object it owns (garbage_collect and
 * release callbacks run), returns its borrows to their owners and frees its
 * transports' user data. Refs and fetches of the runtime stay valid handles
 * that fail with RDT_ERR_CLOSED; release or free them as usual. Fetches of
 * its objects by other runtimes fail with RDT_ERR_PEER_UNAVAILABLE.
 * NULL is accepted and ignored. */
RDT_API rdt_status rdt_runtime_destroy(rdt_runtime *rt);

/* The runtime's control-plane address (such as "inproc://<id>", or
 * "unix:///run/user/1000/rdt/rt-<id>.sock,tcp://<secret>@127.0.0.1:41233").
 * Stored in *out; the string belongs to the runtime and lives until it is
 * destroyed. Treat it as a capability: when the runtime listens on TCP
 * without an auth token, the address carries the runtime's secret, and
 * whoever holds it may connect (it is also inside every serialized ref). rdt
 * never prints it: log lines and error messages show asterisks instead. */
RDT_API rdt_status rdt_runtime_address(const rdt_runtime *rt,
                                       const char **out);

/* For a runtime created with RDT_RUNTIME_QUEUE_RELEASES: moves up to
 * `capacity` user data pointers of freed objects (puts with a non-NULL
 * user_data), oldest first, into `user_data` and their number into *count.
 * Waits up to `timeout_ms` (< 0: forever, 0: do not wait) until at least one
 * is queued; *count is 0 when the time ran out (this is not an error). Each
 * pointer is reported once, after every transport's garbage_collect of its
 * object, exactly where a release callback would have run. Objects that
 * rdt_runtime_destroy() frees are not reported: once it returns, every put
 * object of the runtime is freed. A call waiting when the runtime is
 * destroyed returns RDT_ERR_CLOSED. Errors: INVALID_ARGUMENT (NULL arrays,
 * capacity 0, a runtime without the flag), CLOSED. */
RDT_API rdt_status rdt_runtime_take_released(rdt_runtime *rt, void **user_data,
                                             size_t capacity, size_t *count,
                                             int64_t timeout_ms);

/* ------------------------------------------------------------------------- */
/* Objects and references                                                    */
/* ------------------------------------------------------------------------- */

/* Called exactly once when an object is freed, after every transport's
 * garbage_collect, from an internal thread. It may call rdt functions. */
typedef void (*rdt_release_fn)(void *user_data);

/* Puts `num_tensors` tensors into `rt` as one object and returns the first
 * reference to it in *out (release it with rdt_ref_release()).
 *
 * The tensors are not copied: rdt keeps their descriptions, and transports
 * read the memory when another runtime fetches. Keep the memory valid and
 * unmodified until the object is freed; `release(user_data)` tells you when
 * (or wait with rdt_wait_tensor_freed()). The rdt_tensor array and its shape
 * arrays are only read during the call.
 *
 * `transport` names the transport receivers use (case-insensitive), or NULL
 * for automatic choice per fetch. A named transport extracts its metadata
 * now, on this thread.
 *
 * `user_data` is opaque to rdt: it is never dereferenced, only handed back,
 * so any value (a pointer, a small integer key) may be passed.
 *
 * In a runtime created with RDT_RUNTIME_QUEUE_RELEASES `release` must be
 * NULL, and a non-NULL `user_data` is queued for
 * rdt_runtime_take_released() when the object is freed.
 *
 * Errors: INVALID_ARGUMENT (bad tensor, non-contiguous strides, more than
 * 1,048,576 tensors, a release callback in a runtime that queues releases), NOT_FOUND
 * (no such transport), UNSUPPORTED (the transport does not handle the
 * tensors' device), or a transport's error. On error nothing is kept and
 * `release` is not called (nor `user_data` queued). */
RDT_API rdt_status rdt_put(rdt_runtime *rt, const rdt_tensor *tensors,
                           size_t num_tensors, const char *transport,
                           rdt_release_fn release, void *user_data,
                           rdt_ref **out);

/* A new reference to the same object; release both. */
RDT_API rdt_status rdt_ref_clone(const rdt_ref *ref, rdt_ref **out);

/* Releases one reference. When the last reference anywhere is gone (local
 * handles, serialized refs within their lease, and other runtimes' borrows),
 * the owner frees the object. NULL is accepted. Releasing twice returns
 * INVALID_ARGUMENT. */
RDT_API rdt_status rdt_ref_release(rdt_ref *ref);

/* Flags of rdt_ref_release_ex(). */
/* Also revoke every outstanding lease of the object (see below). Owner only. */
#define RDT_RELEASE_REVOKE_LEASES (1u << 0)

/* rdt_ref_release() with RDT_RELEASE_* flags; flags 0 is rdt_ref_release().
 *
 * With RDT_RELEASE_REVOKE_LEASES, `ref` must belong to the object's owner
 * (rdt_object_info.is_owner). Besides releasing it, every lease of the
 * object ends now, as if it had expired: serialized refs not yet
 * deserialized (the owner's and those its borrowers serialized) stop holding
 * the object, so the owner frees it as soon as no reference of its own and
 * no borrow is left. For a host that knows those bytes will never be
 * deserialized and wants the memory back now, not after lease_ms. When
 * this call frees the object, every transport has dropped it (its
 * garbage_collect ran) before the call returns, so no fetch that starts
 * afterwards reads it; the release callback follows on a library thread.
 * A transfer reading the object when the call is made keeps it until that
 * transfer ends, and the object is freed then.
 * Afterwards, as with expired leases:
 *  - once the object is freed, its bytes fail as those of any freed object:
 *    NOT_FOUND ("already freed") in the owner; elsewhere a reference whose
 *    first fetch fails with NOT_FOUND and reads nothing. This includes bytes
 *    deserialized just before the call whose borrow had not reached the
 *    owner yet: the owner refuses the late borrow, and nothing is counted or
 *    leaked;
 *  - while borrows or other references keep the object, those bytes still
 *    make a borrow that the owner counts;
 *  - borrows the owner already counted are kept: their holders fetch as
 *    before, and the object lives until they release them.
 *
 * NULL is accepted. Errors: INVALID_ARGUMENT (unknown flags,
 * RDT_RELEASE_REVOKE_LEASES on a borrowed reference, a released or bogus
 * handle); on error `ref` is not released. */
RDT_API rdt_status rdt_ref_release_ex(rdt_ref *ref, uint32_t flags);

/* Serializes a reference into bytes that any runtime can deserialize. The
 * bytes keep the object alive for the owner's lease (lease_ms) or until they
 * are deserialized, whichever comes first; deserializing the same bytes again
 * while the object lives is allowed. On success *out_bytes and *out_size hold a
 * buffer the caller frees with rdt_bytes_free(). Serializing a borrowed
 * reference asks the owner for the lease: PEER_UNAVAILABLE if it is gone,
 * NO_MEMORY if this runtime already holds 4096 leases of that owner's objects
 * (bytes serialized and not yet deserialized nor expired). */
RDT_API rdt_status rdt_ref_serialize(const rdt_ref *ref, void **out_bytes,
                                     size_t *out_size);

/* Frees bytes returned by rdt_ref_serialize(). NULL is accepted. */
RDT_API void rdt_bytes_free(void *bytes);

/* Turns serialized bytes into a reference owned by `rt` (a borrow that the
 * owner counts, unless `rt` is the owner). The bytes are only read during
 * the call. The borrow is sent to the owner without waiting for its answer
 * (the lease in the bytes covers the gap), so bytes of an object that was
 * freed meanwhile still make a reference: its first fetch fails with
 * NOT_FOUND, and nothing is read. The only wait is for a connection to the
 * owner when `rt` has none yet; it is bounded by
 * RDT_DESERIALIZE_TIMEOUT_DEFAULT_MS (rdt_ref_deserialize_ex() takes another
 * bound). Errors: CORRUPT (truncated, damaged, oversized or of an unknown
 * format version), NOT_FOUND (the owner is this runtime and does not hold
 * the object: the message says "already freed" for one of its last 1024
 * freed objects, else that the object is unknown to it, never put there or
 * freed long ago), PEER_UNAVAILABLE (the owner cannot be reached), TIMEOUT
 * (the owner did not answer in time: it may be stopped or overloaded).
 * On error nothing is kept, and the same bytes may be deserialized again. */
RDT_API rdt_status rdt_ref_deserialize(rdt_runtime *rt, const void *bytes,
                                       size_t size, rdt_ref **out);

/* How long rdt_ref_deserialize() waits for the owner, in milliseconds. */
#define RDT_DESERIALIZE_TIMEOUT_DEFAULT_MS 30000

typedef struct rdt_deserialize_options {
  uint32_t struct_size; /* set by _init */
  uint32_t reserved;
  /* How long to wait for the owner, in milliseconds, when `rt` has no
   * connection to it yet (connecting and the handshake); then TIMEOUT.
   * 0: RDT_DESERIALIZE_TIMEOUT_DEFAULT_MS. Negative: no deadline of the
   * caller's; a connection attempt still ends after the control plane's
   * handshake timeout (the larger of peer_timeout_ms and 10 s) with
   * PEER_UNAVAILABLE. Within those bounds, a connection attempt that fails
   * because of the network (no route to the owner's host, say, right after
   * a partition healed) is tried again with backoff; a refused one (nothing
   * listens: the owner is gone) is not. A connection attempt the call gave
   * up on goes on in the background, and a later call for the same owner
   * waits for it (or gets its failure, within a second of it) rather than
   * dialing again, so retrying in short slices (to stay responsive to
   * signals) costs nothing extra. */
  int64_t timeout_ms;
} rdt_deserialize_options;

static inline void rdt_deserialize_options_init(rdt_deserialize_options *opts) {
  memset(opts, 0, sizeof *opts);
  opts->struct_size = (uint32_t)sizeof *opts;
}

/* rdt_ref_deserialize() with options. `opts` may be NULL (the defaults).
 * Errors as rdt_ref_deserialize(), and INVALID_ARGUMENT for a struct_size
 * too small. */
RDT_API rdt_status rdt_ref_deserialize_ex(rdt_runtime *rt, const void *bytes,
                                          size_t size,
                                          const rdt_deserialize_options *opts,
                                          rdt_ref **out);

/* Length of an object id in hexadecimal characters. */
#define RDT_OBJECT_ID_LEN 32
/* Longest transport name, in bytes. */
#define RDT_NAME_MAX 63

typedef struct rdt_object_info {
  uint32_t struct_size;   /* set by _init */
  uint32_t num_tensors;
  char object_id[RDT_OBJECT_ID_LEN + 1]; /* hexadecimal, NUL-terminated */
  char transport[RDT_NAME_MAX + 1];      /* "" when chosen per fetch */
  int32_t is_owner;       /* 1 if the ref's runtime owns the object */
  uint64_t nbytes;        /* sum over the tensors */
  int32_t is_writable;    /* 1 for a writable ref (rdt_expose())     */
} rdt_object_info;

static inline void rdt_object_info_init(rdt_object_info *info) {
  memset(info, 0, sizeof *info);
  info->struct_size = (uint32_t)sizeof *info;
}

/* Describes the object a reference points to. `out` must be initialized with
 * rdt_object_info_init(); it is filled up to its struct_size. */
RDT_API rdt_status rdt_ref_info(const rdt_ref *ref, rdt_object_info *out);

typedef struct rdt_tensor_info {
  uint32_t struct_size; /* set by _init */
  int32_t ndim;
  rdt_device device;    /* where the tensor lives on the source */
  rdt_dtype dtype;
  uint64_t nbytes;
  int64_t shape[RDT_MAX_NDIM];
} rdt_tensor_info;

static inline void rdt_tensor_info_init(rdt_tensor_info *info) {
  memset(info, 0, sizeof *info);
  info->struct_size = (uint32_t)sizeof *info;
}

/* Describes tensor `index` of the object. INVALID_ARGUMENT if index is out
 * of range. */
RDT_API rdt_status rdt_ref_tensor_info(const rdt_ref *ref, uint32_t index,
                                       rdt_tensor_info *out);

/* ------------------------------------------------------------------------- */
/* Getting: bytes from an object's owner into local buffers                  */
/* ------------------------------------------------------------------------- */

/* The words of this header (docs/abi.md, "Vocabulary"): a *get* moves an
 * object's bytes from its owner into buffers the caller allocated; a
 * *write* moves local bytes into an object its owner exposed. Each comes
 * blocking (rdt_get, rdt_write), as a pending operation started now and
 * waited on later (rdt_get_start, rdt_write_start: an rdt_pending), and
 * prepared once to run many times (rdt_prepare_get, rdt_prepare_write: an
 * rdt_prepared). An rdt_range is a byte range of one tensor of an object:
 * what a target of a partial get receives, or where a source of a partial
 * write lands. */

/* A byte range of one tensor of an object: `length` bytes from byte `offset`
 * of tensor `tensor` of the object of refs[`ref`]. In a partial get, target
 * i receives the range sources[i] (rdt_get_options); in a partial write,
 * source i lands in the range destinations[i] (rdt_write_options). The
 * offset and length are multiples of the tensor's element size (tensors of
 * sub-byte dtypes are taken whole), and the length is the local tensor's
 * nbytes. Row ranges of a row-major tensor are byte ranges: rows [a, b) of
 * a tensor of shape [R, ...] whose rows are r bytes each are offset a*r,
 * length (b-a)*r. */
typedef struct rdt_range {
  uint32_t ref;    /* index into the call's refs (0 in a transport callback) */
  uint32_t tensor; /* index of the tensor in that ref's object               */
  uint64_t offset; /* first byte of the range in the tensor                 */
  uint64_t length; /* bytes; RDT_REST_OF_TENSOR: from offset to the end     */
} rdt_range;

/* rdt_range.length: the rest of the tensor from its offset. */
#define RDT_REST_OF_TENSOR UINT64_MAX

typedef struct rdt_get_options {
  uint32_t struct_size; /* set by _init */
  uint32_t reserved;
  /* Use this transport for every ref instead of the one each ref names
   * (case-insensitive). NULL: each ref's own, or the automatic choice. */
  const char *transport;
  /* A partial get: target i receives the range sources[i], and
   * num_sources equals num_targets. Any tensors of any of the refs, in any
   * order, each whole or a byte range; a ref no range names is not
   * moved. Only transports that serve ranges (RDT_TRANSPORT_RANGES in
   * rdt_transport_info.flags; every built-in one) take a partial get:
   * naming another is UNSUPPORTED, and the automatic choice skips it.
   * The array is copied. NULL: every tensor of every ref, whole. */
  const rdt_range *sources;
  size_t num_sources;
} rdt_get_options;

static inline void rdt_get_options_init(rdt_get_options *opts) {
  memset(opts, 0, sizeof *opts);
  opts->struct_size = (uint32_t)sizeof *opts;
}

/* Starts a get of `num_refs` objects into caller-allocated targets and
 * returns at once with *out, a pending get to wait on and free (see
 * "Pending gets and writes" below). It never waits on the network: a
 * transfer whose start needs nothing from its owner (already connected,
 * metadata at hand) starts before it returns, and any that must wait for
 * its owner (connecting, the borrow, asking for transport metadata) starts
 * in the background, ended by rdt_pending_abort() and rdt_pending_free() in
 * whichever phase it is, and waited on with rdt_pending_wait() under the
 * caller's deadline.
 *
 * `targets` holds one tensor per source tensor, ref after ref, in order
 * (ref 0's tensors, then ref 1's, ...): `num_targets` must equal the total.
 * Each target must match its source tensor's shape and dtype and be
 * contiguous; its device type is the source's, or crosses between host and
 * CUDA memory (docs/abi.md, "Receiving across host and CUDA memory"; the
 * device id may differ). In a partial get (opts->sources) target i
 * receives the range sources[i] instead: it must have the source tensor's
 * dtype and device type and hold exactly the range's bytes, in any shape.
 * Targets must not overlap. The rdt_tensor array is copied; the memory it
 * points to must stay valid until rdt_pending_wait() returned something
 * other than RDT_ERR_TIMEOUT, or rdt_pending_free() returned. The refs are
 * only read during the call (the get keeps its own references), so they
 * may be released right after.
 *
 * The transfers start concurrently, and every one is started before any is
 * waited on. A ref owned by `rt` itself is copied directly, without a
 * transport. For a two-sided transport the source runtime is asked to send.
 *
 * `opts` may be NULL. Errors: INVALID_ARGUMENT (a target does not match,
 * count mismatch, a released ref, a range outside its tensor or not on its
 * elements, overlapping targets; the message names the numbers), NOT_FOUND
 * (unknown transport override), CLOSED (the runtime was destroyed). When an
 * error is returned nothing is left running and *out is not set. Errors of
 * the later phases are the get's result, from rdt_pending_wait():
 * PEER_UNAVAILABLE, UNSUPPORTED (no transport can move the object, or the
 * peer lacks the one named), TIMEOUT (an owner did not answer a
 * control-plane request within 30 s), or a transport's error. */
RDT_API rdt_status rdt_get_start(rdt_runtime *rt, rdt_ref *const *refs,
                                 size_t num_refs, const rdt_tensor *targets,
                                 size_t num_targets,
                                 const rdt_get_options *opts,
                                 rdt_pending **out);

/* rdt_get_start(), rdt_pending_wait(timeout_ms) and rdt_pending_free() in one
 * call: `timeout_ms` bounds all of it, connecting to the owners included.
 * On RDT_ERR_TIMEOUT the transfers were aborted before returning (so it
 * returns later than the deadline only by the time an abort takes, or, for
 * a transport that cannot abort, when that transport finished). */
RDT_API rdt_status rdt_get(rdt_runtime *rt, rdt_ref *const *refs,
                           size_t num_refs, const rdt_tensor *targets,
                           size_t num_targets, const rdt_get_options *opts,
                           int64_t timeout_ms);

/* Waits until no object of `rt` holds a tensor whose `data` pointer equals
 * `data` (as given to rdt_put), so the memory may be written or freed again.
 * RDT_OK at once if none does. RDT_ERR_TIMEOUT if the deadline passes. */
RDT_API rdt_status rdt_wait_tensor_freed(rdt_runtime *rt, const void *data,
                                         int64_t timeout_ms);

/* ------------------------------------------------------------------------- */
/* Pending gets and writes                                                   */
/* ------------------------------------------------------------------------- */

/* rdt_get_start() and rdt_write_start() return an rdt_pending: one get or
 * one write under way, waited on, aborted and freed by the calls below,
 * which work alike for both. Below, "the local tensors" are a get's targets
 * (written by it) or a write's sources (read by it). */

/* Waits until every transfer of the pending get or write completed, up to
 * `timeout_ms`, whatever phase the transfers are in (still connecting to an
 * owner, waiting for its metadata or admission, or moving bytes).
 *
 * RDT_OK: every byte moved (a get's targets hold the objects' bytes; a
 * write's bytes all landed). RDT_ERR_TIMEOUT: the deadline passed first;
 * the operation is still valid and running; wait again, abort or free it.
 * Any other error is the first error a transfer hit; by the time it is
 * returned every other transfer has completed or been aborted and
 * released, so nothing touches the local tensors any more. Calling wait
 * again after a final result returns the same result. */
RDT_API rdt_status rdt_pending_wait(rdt_pending *pending, int64_t timeout_ms);

/* Asks every unfinished transfer to stop and returns without waiting. A
 * later rdt_pending_wait() returns RDT_ERR_ABORTED (or RDT_OK if everything
 * had already completed) once no transfer touches the local tensors. A
 * transport that cannot abort is left to finish. */
RDT_API rdt_status rdt_pending_abort(rdt_pending *pending);

/* Gives a file descriptor that becomes readable once the pending get or
 * write is complete: every transfer done, failed or aborted, so that
 * rdt_pending_wait(pending, 0) returns the final result instead of
 * RDT_ERR_TIMEOUT. An event loop (poll, epoll, asyncio's add_reader, libuv)
 * waits on it without a thread per operation; then call
 * rdt_pending_wait(pending, 0) for the result.
 *
 * Ownership: the descriptor belongs to the rdt_pending. It is made on the
 * first call (later calls give the same one), stays readable from
 * completion until rdt_pending_free(), which closes it, and is
 * close-on-exec and nonblocking. Never close it, read from it or write to
 * it; stop watching it before rdt_pending_free(). On Linux it is an
 * eventfd.
 *
 * Errors: INVALID_ARGUMENT (fd_out is NULL, a freed handle), NO_MEMORY (the
 * process is out of file descriptors). */
RDT_API rdt_status rdt_pending_event_fd(rdt_pending *pending, int *fd_out);

/* Frees a pending get or write. If transfers are still running they are
 * aborted, and this waits until none touches the local tensors any more —
 * for a transport that cannot abort, until it finishes. NULL is
 * accepted. */
RDT_API rdt_status rdt_pending_free(rdt_pending *pending);

/* ------------------------------------------------------------------------- */
/* Writing into exposed objects (push)                                       */
/* ------------------------------------------------------------------------- */

/* Exposes `num_tensors` tensors of `rt` for other runtimes to write into and
 * returns the first reference to the new object in *out: a writable ref.
 * Arguments, ownership, the release callback and errors are those of
 * rdt_put(); `transport` must be one that writes (RDT_TRANSPORT_WRITES:
 * cma, shm, tcp, nixl, cuda_ipc, or one registered with the flag), or NULL
 * for the automatic choice per write, else UNSUPPORTED.
 *
 * A writable ref is a capability: its serialized bytes carry a random write
 * key, and the owner admits a write only from a holder that presents it.
 * Hand the bytes only to the processes that may write. Writes land only
 * inside the exposed bytes. A writable object is never the source of a get
 * (INVALID_ARGUMENT); read the memory in this process.
 *
 * Every write the owner admitted ends in exactly one notice, taken with
 * rdt_write_notice_wait(). While writes are open the memory may change at
 * any time; a notice with status RDT_OK means every byte of that write
 * landed. Writers hold the object like borrowers of a put object:
 * wait_tensor_freed and the release callback say when every writer is
 * done with it. */
RDT_API rdt_status rdt_expose(rdt_runtime *rt, const rdt_tensor *tensors,
                              size_t num_tensors, const char *transport,
                              rdt_release_fn release, void *user_data,
                              rdt_ref **out);

typedef struct rdt_write_options {
  uint32_t struct_size; /* set by _init */
  uint32_t reserved;
  /* Use this transport for every ref (case-insensitive). NULL: each ref's
   * own, or the automatic choice among the transports that write. */
  const char *transport;
  /* A partial write: source i lands in the range destinations[i], a byte
   * range of a tensor of refs[destinations[i].ref] (the rdt_range of a
   * partial get, for the other direction), and num_destinations equals
   * num_sources. The array is copied. NULL: every tensor of every ref,
   * whole. */
  const rdt_range *destinations;
  size_t num_destinations;
  /* Handed to the owner with the notice of each ref's write (a version or
   * step number, say). */
  uint64_t tag;
} rdt_write_options;

static inline void rdt_write_options_init(rdt_write_options *opts) {
  memset(opts, 0, sizeof *opts);
  opts->struct_size = (uint32_t)sizeof *opts;
}

/* Starts writing local `sources` into the objects of writable refs and
 * returns at once with *out, a pending write: the rdt_pending of a get,
 * waited on, aborted and freed with the same calls (rdt_pending_wait(),
 * rdt_pending_abort(), rdt_pending_event_fd(), rdt_pending_free()). The
 * sources are matched to the refs' tensors as rdt_get_start() matches
 * targets (one per tensor, ref after ref, or one per destination range);
 * they are only read and may overlap. Their memory must stay valid until
 * the wait returned something other than RDT_ERR_TIMEOUT, or
 * rdt_pending_free() returned.
 *
 * For each ref the owner is asked to admit the write (the key, the ranges,
 * the tag), the bytes move, and then the owner is told the outcome, which
 * becomes its notice. Later writes into the same object, over the same
 * transport and at the same ranges, run under the admission the first was
 * granted while it stays open (a standing admission, docs/abi.md): they
 * announce their tag to the owner instead of waiting for it. When the wait returns an error the sources are no
 * longer read; bytes already on their way may still land on the owner's
 * side, always before the owner's notice for the write, which says it
 * failed.
 *
 * Errors at start: INVALID_ARGUMENT (a ref that is not writable, a source
 * that does not match, a range outside its tensor; nothing is written),
 * NOT_FOUND (unknown transport). Errors of the wait: PERMISSION_DENIED (a
 * wrong write key, a revoked object), NO_MEMORY (the owner holds too many
 * notices not taken), UNSUPPORTED (no transport writes between these
 * runtimes), PEER_UNAVAILABLE, TIMEOUT, ABORTED, or a transport's error. */
RDT_API rdt_status rdt_write_start(rdt_runtime *rt, rdt_ref *const *refs,
                                   size_t num_refs, const rdt_tensor *sources,
                                   size_t num_sources,
                                   const rdt_write_options *opts,
                                   rdt_pending **out);

/* rdt_write_start(), rdt_pending_wait(timeout_ms) and rdt_pending_free() in
 * one call, under one deadline, like rdt_get(). */
RDT_API rdt_status rdt_write(rdt_runtime *rt, rdt_ref *const *refs,
                             size_t num_refs, const rdt_tensor *sources,
                             size_t num_sources, const rdt_write_options *opts,
                             int64_t timeout_ms);

/* Longest message a notice keeps, in bytes. */
#define RDT_NOTICE_MESSAGE_MAX 255

/* How one write into an exposed object ended. */
typedef struct rdt_write_notice {
  uint32_t struct_size; /* set by _init */
  /* RDT_OK: every byte of the write landed. Anything else: the write
   * failed, was aborted, or its writer went away with it open; the bytes it
   * covers may hold any mix of old and new values (a torn write). */
  rdt_status status;
  /* The writer's rdt_write_options.tag, or the tag of its rdt_prepared_run:
   * that of the write or run the notice is for. (A writer gone between the
   * writes of a standing admission leaves no notice: none was under way.) */
  uint64_t tag;
  uint64_t nbytes; /* the bytes the write covered */
  char writer[RDT_OBJECT_ID_LEN + 1]; /* the writing runtime's id, hex */
  char message[RDT_NOTICE_MESSAGE_MAX + 1]; /* why it failed; "" on RDT_OK */
} rdt_write_notice;

static inline void rdt_write_notice_init(rdt_write_notice *notice) {
  memset(notice, 0, sizeof *notice);
  notice->struct_size = (uint32_t)sizeof *notice;
}

/* Takes the oldest notice of a write into an object this runtime exposed
 * (`exposed` is the owner's ref), waiting up to `timeout_ms` (<0 forever, 0
 * poll) for one. Notices come in the order writes ended. RDT_OK fills
 * `out` (initialized with _init). TIMEOUT: none came. NOT_FOUND: the object
 * was freed. INVALID_ARGUMENT: a ref that is not the owner's of an exposed
 * object.
 *
 * The owner keeps at most 4,096 writes open and notices not taken per
 * object; past that, writes are refused (the writer's wait returns
 * NO_MEMORY), so an owner that stops taking notices slows its writers
 * instead of losing notices. */
RDT_API rdt_status rdt_write_notice_wait(rdt_ref *exposed, int64_t timeout_ms,
                                         rdt_write_notice *out);

/* Gives a descriptor that is readable while notices of the exposed object
 * wait to be taken (an eventfd; poll it, then take notices with
 * rdt_write_notice_wait(exposed, 0) until TIMEOUT). It belongs to the
 * object: made on the first call, closed when the object is freed; never
 * close, read or write it. */
RDT_API rdt_status rdt_write_notice_event_fd(rdt_ref *exposed, int *fd_out);

/* Revokes every writable ref of an object this runtime exposed: no write is
 * admitted any more (PERMISSION_DENIED), serialized refs not yet
 * deserialized stop holding it, and this waits up to `timeout_ms` (<0
 * forever, 0 poll) until no admitted write is open. RDT_OK: nothing writes
 * into the memory any more. TIMEOUT: writes are still open (their notices
 * will come); the revocation stays, call again to wait more. */
RDT_API rdt_status rdt_ref_revoke_writes(rdt_ref *exposed, int64_t timeout_ms);

/* ------------------------------------------------------------------------- */
/* Prepared transfers                                                        */
/* ------------------------------------------------------------------------- */

/* A get or a write resolved once and run many times with the same refs,
 * tensors and options: weight sync every step, KV blocks between the same
 * two processes. Its first run is an ordinary rdt_get() or rdt_write(),
 * which connects to the owners, chooses the transports and gets the
 * metadata; later runs only start the transports and wait (a write's runs
 * share its first run's standing admission, each announced with its tag,
 * and make one notice per run). A run whose owner is gone fails with
 * RDT_ERR_PEER_UNAVAILABLE before anything moves; every run has the
 * deadline, abort-on-deadline and "nothing moves after an error returns"
 * guarantees of rdt_get(). Transfers that cannot be kept (an object of `rt`
 * itself, a two-sided transport, targets staged through host memory) run
 * the ordinary way each time. See docs/abi.md, "Prepared transfers". */
typedef struct rdt_prepared rdt_prepared;

/* Prepares a get of `refs` into `targets`; arguments as rdt_get(), checked
 * here. Nothing moves until rdt_prepared_run(). The prepared transfer takes
 * its own handles on the refs (the caller may free its own: the objects
 * stay borrowed until rdt_prepared_free()) and copies the rdt_tensor array;
 * the memory the targets point to must stay valid until
 * rdt_prepared_free(). On success *out is the caller's, to free with
 * rdt_prepared_free(); on error *out is untouched. */
RDT_API rdt_status rdt_prepare_get(rdt_runtime *rt, rdt_ref *const *refs,
                                   size_t num_refs, const rdt_tensor *targets,
                                   size_t num_targets,
                                   const rdt_get_options *opts,
                                   rdt_prepared **out);

/* Prepares a write of `sources` into writable refs; arguments as
 * rdt_write() (opts->tag is not used: each run gives its tag), ownership as
 * rdt_prepare_get(). */
RDT_API rdt_status rdt_prepare_write(rdt_runtime *rt, rdt_ref *const *refs,
                                     size_t num_refs, const rdt_tensor *sources,
                                     size_t num_sources,
                                     const rdt_write_options *opts,
                                     rdt_prepared **out);

/* Runs the prepared transfer once and returns when it ended, or after
 * `timeout_ms` (negative: no limit) with RDT_ERR_TIMEOUT, the run aborted
 * and stopped. `tag` is a write's notice tag; a get ignores it. Runs of
 * one prepared transfer are serialized. RDT_ERR_CLOSED once its runtime was
 * destroyed; otherwise the errors of rdt_get() and rdt_write(). */
RDT_API rdt_status rdt_prepared_run(rdt_prepared *prepared, uint64_t tag,
                                    int64_t timeout_ms);

/* Frees a prepared transfer, after a run in progress ended, and releases its
 * handles on the refs. NULL is ignored. */
RDT_API rdt_status rdt_prepared_free(rdt_prepared *prepared);

/* ------------------------------------------------------------------------- */
/* Views: one copy for every reader on a host                                */
/* ------------------------------------------------------------------------- */

/* A view is an object's tensors read where they lie instead of copied into
 * each reader: for an object of another runtime on this host, the owner's
 * staged copy (shm's sealed segment) mapped into this process; for an
 * object of `rt` itself, its put tensors. N readers on a host then share one
 * copy. A mapping is read-only (writing it faults), or with
 * RDT_VIEW_PRIVATE copy-on-write (writes land in pages of this process
 * alone). Its bytes are the object's as staged and never change: the owner
 * cannot write, shrink or reuse them, and they stay readable after the
 * owner freed the object, died or was destroyed, until the view is
 * released. A view holds its own handle on the object (a borrow the owner
 * counts, as a ref's), so the owner frees it only after the view and every
 * ref are released. See docs/abi.md, "Views". */
typedef struct rdt_view rdt_view;

/* rdt_view_options.flags: map copy-on-write, so that the view may be
 * written and what is written stays in this process. */
#define RDT_VIEW_PRIVATE (1u << 0)

typedef struct rdt_view_options {
  uint32_t struct_size; /* set by _init */
  uint32_t flags;       /* RDT_VIEW_* */
  /* The transport that maps the owner's bytes (case-insensitive). NULL:
   * the first registered one that can (shm). */
  const char *transport;
} rdt_view_options;

static inline void rdt_view_options_init(rdt_view_options *opts) {
  memset(opts, 0, sizeof *opts);
  opts->struct_size = (uint32_t)sizeof *opts;
}

/* Makes a view of `ref`'s object within `timeout_ms` (negative: no limit),
 * which bounds connecting to the owner, the borrow and the mapping. `ref`
 * is only read (the view takes its own handle: release the ref whenever).
 * `opts` may be NULL. On success *out is the caller's, to release with
 * rdt_view_release(); on error *out is untouched and nothing is held.
 * Errors: INVALID_ARGUMENT (a released ref, a ref of another runtime, a
 * writable ref), UNSUPPORTED (a tensor outside host memory, an owner on
 * another host, a transport that cannot map: fetch a copy instead),
 * NOT_FOUND (the object was freed; an unknown transport), PEER_UNAVAILABLE
 * (the owner is gone), TIMEOUT, PERMISSION_DENIED (the owner's segment is
 * not sealed), CORRUPT (the ref's tensor count or sizes disagree with the
 * owner's metadata: a ref rewritten since the owner made it), CLOSED. */
RDT_API rdt_status rdt_view_open(rdt_runtime *rt, const rdt_ref *ref,
                                 const rdt_view_options *opts,
                                 int64_t timeout_ms, rdt_view **out);

/* Where each tensor of the viewed object starts in this process: data_out
 * (an array of `count` pointers, the caller's) gets tensor i's address at
 * [i]; `count` must be the object's tensor count (rdt_ref_info()). The
 * addresses are valid until rdt_view_release(); how many bytes each holds
 * is rdt_view_sizes()'s, which the ref's shapes and dtypes
 * (rdt_ref_tensor_info()) agree with; a tensor of no bytes may have any
 * address. *out_mapped (may be NULL) is 1 for a mapping of another
 * process's object, 0 for a runtime's own tensors. INVALID_ARGUMENT for
 * another count, a NULL array or a released view. */
RDT_API rdt_status rdt_view_data(const rdt_view *view, void **data_out,
                                 size_t count, int *out_mapped);

/* How many bytes of each tensor of the viewed object lie at its address
 * (rdt_view_data()): nbytes_out (an array of `count`, the caller's) gets
 * tensor i's at [i]. They are the owner's, checked at rdt_view_open()
 * against the mapping and against the ref (a ref whose tensors disagree
 * with the owner's metadata is refused there with CORRUPT), so reading
 * [data, data + nbytes) never leaves the mapping. INVALID_ARGUMENT for
 * another count, a NULL array or a released view. */
RDT_API rdt_status rdt_view_sizes(const rdt_view *view, uint64_t *nbytes_out,
                                  size_t count);

/* Unmaps the view and releases its handle on the object. NULL is ignored;
 * a view released twice is INVALID_ARGUMENT. */
RDT_API rdt_status rdt_view_release(rdt_view *view);

/* ------------------------------------------------------------------------- */
/* Transports                                                                */
/* ------------------------------------------------------------------------- */

/* Roles in rdt_transfer.role. */
#define RDT_ROLE_SOURCE 1
#define RDT_ROLE_DESTINATION 2

/* Describes one transfer of one object to a transport's callbacks. Every
 * string is NUL-terminated and valid only during the callback. */
typedef struct rdt_transfer {
  uint32_t struct_size;
  uint32_t role;              /* RDT_ROLE_* : which side this callback is on */
  const char *object_id;      /* RDT_OBJECT_ID_LEN hexadecimal characters   */
  uint64_t transfer_id;       /* unique per transfer, the same on both sides */
  const char *transport;      /* canonical (lower-case) transport name       */
  const char *source_runtime; /* runtime ids (hexadecimal) and addresses     */
  const char *source_address;
  const char *destination_runtime;
  const char *destination_address;
  /* For transports registered with RDT_TRANSPORT_RANGES: in a
   * partial get, targets[i] (recv, fetch) receives ranges[i], whose ref
   * is 0 and whose length is resolved; on a two-sided transport's source,
   * send sends those bytes of `tensors`, in that order; in a partial write,
   * sources[i] (write, write_start) lands in ranges[i] of the owner's
   * object. NULL (num_ranges 0): every tensor, whole, targets[i] (or
   * sources[i]) being tensor i. Checked against the object before the
   * callback. */
  const rdt_range *ranges;
  size_t num_ranges;
} rdt_transfer;

/* An output buffer handed to a callback; fill it with rdt_buffer_set(). */
typedef struct rdt_buffer rdt_buffer;

/* Copies `size` bytes into a callback's output buffer, replacing what it
 * held. Only valid inside the callback that received `buf`. Errors:
 * INVALID_ARGUMENT (NULL buf, NULL data with size > 0), NO_MEMORY. */
RDT_API rdt_status rdt_buffer_set(rdt_buffer *buf, const void *data,
                                  size_t size);

/* Attaches a message to the error a transport callback is about to return
 * (called from inside the callback, on its thread). rdt reports it to the
 * caller of rdt_get()/rdt_pending_wait() with the transport's name. Copied. */
RDT_API void rdt_set_error(const char *message);

/* Transport flags. */
#define RDT_TRANSPORT_ONE_SIDED (1u << 0) /* the receiver reads alone       */
#define RDT_TRANSPORT_CAN_ABORT (1u << 1) /* abort() stops transfers safely */
#define RDT_TRANSPORT_BUILTIN (1u << 2)   /* reported by rdt_transport_list */
/* Reported by rdt_transport_list: reaches only runtimes on its own host. */
#define RDT_TRANSPORT_SAME_HOST_ONLY (1u << 3)
/* Serves partial fetches (rdt_transfer.ranges), moving only the
 * ranges' bytes. rdt refuses a partial fetch over a transport without it. */
#define RDT_TRANSPORT_RANGES (1u << 4)
/* Writes into exposed objects (rdt_write_start). Reported by
 * rdt_transport_list; a transport the application registers sets it in
 * vtable->flags together with RDT_TRANSPORT_ONE_SIDED (the owner runs none
 * of its callbacks during a write) and gives write or write_start. */
#define RDT_TRANSPORT_WRITES (1u << 5)

/* A transport implemented by the application, modelled on Ray's
 * TensorTransportManager. rdt calls these from its own threads, possibly
 * several at once; never while holding a lock that another rdt call needs,
 * so callbacks may call rdt functions. Each returns RDT_OK or an error code
 * (with rdt_set_error() for a message). Callbacks marked optional may be
 * NULL.
 *
 * Metadata arguments (`tmeta`: transport metadata made by extract_metadata on
 * the source; `cmeta`: communicator metadata made by communicator_metadata on
 * the destination) are borrowed bytes, valid during the callback. */
typedef struct rdt_transport_vtable {
  uint32_t struct_size; /* set by _init */
  /* RDT_TRANSPORT_ONE_SIDED, RDT_TRANSPORT_CAN_ABORT, RDT_TRANSPORT_RANGES,
   * RDT_TRANSPORT_WRITES; any other bit is INVALID_ARGUMENT. */
  uint32_t flags;
  void *user_data;      /* passed to every callback; opaque to rdt */
  /* Optional. Called once when the runtime is destroyed, after the last
   * callback; also when registration fails. */
  void (*free_user_data)(void *user_data);

  /* Optional. Source, at rdt_put: describe the tensors for receivers (for
   * example register the memory and return its keys). The result travels in
   * every serialized ref. NULL or an empty buffer: no metadata. */
  rdt_status (*extract_metadata)(void *user_data, const char *object_id,
                                 const rdt_tensor *tensors, size_t num_tensors,
                                 rdt_buffer *out);

  /* Optional. Destination, once per transfer before anything moves: the
   * communicator metadata (for example a rank pair or a channel id), passed
   * to recv/fetch here and, for two-sided transports, to send on the source.
   * For a write it runs on the writer (role RDT_ROLE_SOURCE) and its result
   * goes to write/write_start. */
  rdt_status (*communicator_metadata)(void *user_data,
                                      const rdt_transfer *transfer,
                                      rdt_buffer *out);

  /* Required for two-sided transports, unused for one-sided ones. Source:
   * called by the source runtime when a destination asks; send the tensors
   * and return when done (or failed, or aborted). */
  rdt_status (*send)(void *user_data, const rdt_transfer *transfer,
                     const rdt_tensor *tensors, size_t num_tensors,
                     const void *tmeta, size_t tmeta_size, const void *cmeta,
                     size_t cmeta_size);

  /* Destination: receive every tensor into `targets` (shapes, dtypes and
   * sizes already checked) and return when done. Required unless fetch and
   * wait are given; rdt runs it on its own thread, concurrently with the
   * other transfers of the same fetch. */
  rdt_status (*recv)(void *user_data, const rdt_transfer *transfer,
                     const rdt_tensor *targets, size_t num_targets,
                     const void *tmeta, size_t tmeta_size, const void *cmeta,
                     size_t cmeta_size);

  /* Optional, all three or none. Destination, asynchronous receive: fetch
   * starts the transfer and returns at once with an opaque *request (any
   * value, such as a small integer: rdt never dereferences it); wait
   * blocks until it completes (rdt passes timeout_ms -1 and uses abort to
   * interrupt it; return RDT_ERR_TIMEOUT if a finite timeout passes);
   * release_request frees the request. rdt calls release_request exactly
   * once for every request fetch returned, after the last wait or abort.
   * wait and release_request also serve write_start's requests (below):
   * give them whenever fetch or write_start is given, and only then. */
  rdt_status (*fetch)(void *user_data, const rdt_transfer *transfer,
                      const rdt_tensor *targets, size_t num_targets,
                      const void *tmeta, size_t tmeta_size, const void *cmeta,
                      size_t cmeta_size, void **request);
  rdt_status (*wait)(void *user_data, void *request, int64_t timeout_ms);
  void (*release_request)(void *user_data, void *request);

  /* Optional. Source: the object is freed; release what extract_metadata
   * set up. Called exactly once per object that extracted metadata. */
  void (*garbage_collect)(void *user_data, const char *object_id,
                          const rdt_tensor *tensors, size_t num_tensors,
                          const void *tmeta, size_t tmeta_size);

  /* Required with RDT_TRANSPORT_CAN_ABORT. Either side: stop the transfer so
   * that the pending recv/wait/send/write returns soon and nothing more is
   * written into the targets (for a write: into the owner's memory).
   * `request` is the fetch or write_start request, or NULL for recv, send
   * and write. May be called while recv, wait, send or write runs on
   * another thread. */
  rdt_status (*abort)(void *user_data, const rdt_transfer *transfer,
                      void *request);

  /* Writes. Appended after abort: a vtable whose struct_size ends before
   * them (built against an older rdt.h) reads them as NULL and registers a
   * transport that does not write.
   * With RDT_TRANSPORT_WRITES, write or write_start is required (if both
   * are given rdt uses write_start); without the flag setting either is
   * INVALID_ARGUMENT.
   *
   * Writer: write `sources` into an object another runtime exposed with
   * this transport (rdt_expose), on the writer's own, without the owner
   * running any callback. `transfer->role` is RDT_ROLE_SOURCE (the writer)
   * and `transfer->destination_*` name the owner. `tmeta` is what
   * extract_metadata made for the exposed tensors on the owner (where they
   * lie, say); the owner hands it only to writers it admitted, after
   * checking their write key. `cmeta` is communicator_metadata's, made on
   * the writer. Without `transfer->ranges`, sources[i] lands in exposed
   * tensor i, whole (shapes, dtypes and sizes already checked); with
   * RDT_TRANSPORT_RANGES a partial write gives `ranges`, and sources[i]
   * lands in ranges[i] (ref 0, length resolved, checked against the object
   * by both runtimes; check it against your own metadata too) and must touch
   * no byte outside it. Sources are only read, and are borrowed: `sources`
   * and the memory they describe are valid until write returns, or for
   * write_start until release_request.
   *
   * write: synchronous, run on one of rdt's threads, concurrently with the
   * other transfers of the same write. Return when every byte is in place
   * (RDT_OK), or with an error (rdt_set_error() for a message) once no byte
   * of this write can land any more; after abort(transfer, NULL), return
   * soon. The error reaches the writer's rdt_pending_wait() and the owner's
   * notice for the write says it failed.
   *
   * write_start: asynchronous: start the write and return at once with an
   * opaque *request, which rdt waits on with `wait`, interrupts with
   * abort(transfer, request) and frees with `release_request` (given, with
   * write_start, under the rules above). When wait returns RDT_OK every
   * byte is in place; when it returns an error, no byte lands any more.
   * An error from write_start itself means nothing was written. */
  rdt_status (*write)(void *user_data, const rdt_transfer *transfer,
                      const rdt_tensor *sources, size_t num_sources,
                      const void *tmeta, size_t tmeta_size, const void *cmeta,
                      size_t cmeta_size);
  rdt_status (*write_start)(void *user_data, const rdt_transfer *transfer,
                            const rdt_tensor *sources, size_t num_sources,
                            const void *tmeta, size_t tmeta_size,
                            const void *cmeta, size_t cmeta_size,
                            void **request);
} rdt_transport_vtable;

static inline void rdt_transport_vtable_init(rdt_transport_vtable *vt) {
  memset(vt, 0, sizeof *vt);
  vt->struct_size = (uint32_t)sizeof *vt;
}

/* Registers a transport with `rt` under `name` (1 to RDT_NAME_MAX bytes of
 * letters, digits, '_', '-' and '.'; matched case-insensitively). `devices`
 * lists the RDT_DEVICE_* types it moves (at least one). The vtable is copied;
 * on success the runtime owns `vtable->user_data` and calls
 * free_user_data when destroyed; on any failure free_user_data is called
 * before returning (unless `vtable` is NULL or its struct_size is too small
 * to hold the field). Register the transport under the same name in every runtime
 * that uses it. Errors: INVALID_ARGUMENT (bad name, no devices, an unknown
 * flag, a required callback missing, RDT_TRANSPORT_WRITES without
 * RDT_TRANSPORT_ONE_SIDED), ALREADY_EXISTS. */
RDT_API rdt_status rdt_register_transport(rdt_runtime *rt, const char *name,
                                          const int32_t *devices,
                                          size_t num_devices,
                                          const rdt_transport_vtable *vtable);

/* Most device types a transport lists in rdt_transport_info. */
#define RDT_MAX_DEVICES 8

typedef struct rdt_transport_info {
  uint32_t struct_size;            /* set by _init */
  uint32_t flags;                  /* RDT_TRANSPORT_* */
  char name[RDT_NAME_MAX + 1];     /* canonical lower-case name */
  uint32_t num_devices;
  int32_t devices[RDT_MAX_DEVICES];
  uint64_t transfers_completed;    /* as destination */
  uint64_t transfers_failed;       /* as destination */
  uint64_t bytes_received;
  uint64_t sends_completed;        /* as source, two-sided */
  uint64_t bytes_sent;             /* as source, two-sided */
  /* The transport's place in the automatic choice (a fetch of a ref put
   * without a transport): transports are tried in increasing rank, and 0
   * leaves it out. For objects in host memory, and for objects with a
   * tensor in CUDA memory; RDT_TRANSPORT_SAME_HOST_ONLY transports are
   * left out for peers on another host. */
  uint32_t auto_rank_host;
  uint32_t auto_rank_cuda;
  /* Writes this runtime made into other runtimes' exposed objects over the
   * transport (rdt_write and its kin), counted as gets are above. */
  uint64_t writes_completed;
  uint64_t writes_failed;
  uint64_t bytes_written;
} rdt_transport_info;

static inline void rdt_transport_info_init(rdt_transport_info *info) {
  memset(info, 0, sizeof *info);
  info->struct_size = (uint32_t)sizeof *info;
}

/* Lists the transports registered with `rt`, sorted by name. *count gets the
 * number registered; up to `capacity` entries are written to `infos`
 * (which may be NULL when capacity is 0). The array's stride is
 * infos[0].struct_size, so initialize every element with
 * rdt_transport_info_init(). */
RDT_API rdt_status rdt_transport_list(rdt_runtime *rt,
                                      rdt_transport_info *infos,
                                      size_t capacity, size_t *count);

/* Longest reason an rdt_unavailable_transport holds; a longer one is cut. */
#define RDT_REASON_MAX 511

/* A built-in transport that `rt` could not make on this host, and why. */
typedef struct rdt_unavailable_transport {
  uint32_t struct_size;           /* set by _init */
  int32_t status;                 /* an rdt_status: the failure's kind */
  char name[RDT_NAME_MAX + 1];    /* canonical lower-case name */
  char reason[RDT_REASON_MAX + 1]; /* the transport's own words */
} rdt_unavailable_transport;

static inline void rdt_unavailable_transport_init(
    rdt_unavailable_transport *info) {
  memset(info, 0, sizeof *info);
  info->struct_size = (uint32_t)sizeof *info;
}

/* Lists the built-in transports missing from `rt` (their library, device or
 * kernel feature is absent here), sorted by name, with the reason each gave
 * when the runtime was created; a transport registered later under that
 * name leaves the list. Counts, capacity and stride as rdt_transport_list();
 * initialize every element with rdt_unavailable_transport_init(). */
RDT_API rdt_status rdt_transport_list_unavailable(rdt_runtime *rt,
                                                  rdt_unavailable_transport *infos,
                                                  size_t capacity, size_t *count);

/* How the library was built, as lines of "key=value": go (the Go version),
 * os, arch, compiler, cc (the C compiler), buildmode, tags, cgo, goamd64 or
 * goarm64 (the instruction set level), vcs.revision, vcs.time and
 * vcs.modified (when the build recorded them). Keys without a value are
 * left out; more keys may be added. Static storage; never NULL. */
RDT_API const char *rdt_build_info(void);

/* ------------------------------------------------------------------------- */
/* Collective groups (for two-sided transports such as nccl)                 */
/* ------------------------------------------------------------------------- */

/* A group is a named set of runtimes, one per rank 0..world_size-1, that a
 * communicator-based transport (nccl) moves tensors within: a ref put with
 * transport "nccl" is fetched by a runtime of a group that also holds its
 * owner. Every rank calls rdt_group_create() with the same name and world
 * size and its own rank, like torch.distributed.init_process_group; rank 0
 * hosts the rendezvous over rdt's control plane (the others connect to it,
 * retrying until rank 0 has created the group), makes the communicator's
 * unique id and hands it to every rank, and each rank then forms the
 * communicator on its device.
 *
 * A transfer over a group that fails or is aborted destroys the group on
 * that rank (the NCCL communicator is aborted); later transfers over it fail
 * with "group <name> was destroyed after <cause>". Destroy it on every rank
 * and create it again to continue. */

typedef struct rdt_group_options {
  uint32_t struct_size; /* set by _init */
  uint32_t reserved;
  /* The transport that forms the group's communicator (case-insensitive).
   * NULL: "nccl". */
  const char *backend;
} rdt_group_options;

static inline void rdt_group_options_init(rdt_group_options *opts) {
  memset(opts, 0, sizeof *opts);
  opts->struct_size = (uint32_t)sizeof *opts;
}

/* Longest group name, in bytes (letters, digits, '_', '-', '.' and ':'). */
#define RDT_GROUP_NAME_MAX 127

/* Forms this runtime's rank of the group `name` and returns when every rank
 * has joined and the communicator is formed on CUDA device `device` (an
 * ordinal as this process sees it). `rank0_address` is rank 0's
 * rdt_runtime_address() (any rank may pass it; rank 0 ignores it, and may
 * pass NULL). `opts` may be NULL. `timeout_ms` bounds the whole formation;
 * negative waits forever; 0 is INVALID_ARGUMENT. Strings are only read
 * during the call.
 *
 * Errors: INVALID_ARGUMENT (NULL rt or name, bad name, world_size outside
 * 1..65536, rank outside 0..world_size-1, no rank0_address on another rank,
 * device out of range, ranks disagreeing on the world size), ALREADY_EXISTS
 * (a group of that name exists or is forming in this runtime, or another
 * runtime took this rank), UNSUPPORTED (the backend is not available here:
 * for nccl, libnccl.so.2 — or $RDT_NCCL_LIBRARY — and a CUDA driver with a
 * device are needed), TIMEOUT (a rank did not join in time; the message
 * names the missing ranks), CLOSED, or the backend's error. On error the
 * runtime keeps no trace of the group. */
RDT_API rdt_status rdt_group_create(rdt_runtime *rt, const char *name,
                                    int32_t world_size, int32_t rank,
                                    const char *rank0_address, int32_t device,
                                    const rdt_group_options *opts,
                                    int64_t timeout_ms);

/* Destroys this runtime's rank of a group (the communicator is freed after
 * its pending work: transfers whose NCCL work is enqueued finish first, and
 * this call waits for them unless one fails or is aborted, which aborts the
 * communicator instead; later transfers fail). Other ranks destroy theirs
 * with their own call, at about the same time: NCCL frees a communicator
 * only once the group's other ranks on the same host have freed theirs too
 * (or exited), and this call waits for that at most RDT_NCCL_TEARDOWN_MS
 * (10 s; docs/configuration.md). rdt_runtime_destroy destroys a runtime's
 * remaining groups all at once, within the same bound.
 * Errors: INVALID_ARGUMENT (NULL rt or name, a group still forming),
 * NOT_FOUND (no such group here), TIMEOUT (NCCL had not freed the
 * communicator within the bound: the group is gone from this runtime all
 * the same, and NCCL frees it in the background once the other ranks do
 * their part). */
RDT_API rdt_status rdt_group_destroy(rdt_runtime *rt, const char *name);

/* ------------------------------------------------------------------------- */
/* Observability                                                             */
/* ------------------------------------------------------------------------- */

typedef struct rdt_stats {
  uint32_t struct_size; /* set by _init */
  uint32_t reserved;
  uint64_t objects;          /* objects owned, not yet freed                 */
  uint64_t objects_freed;    /* objects freed since creation                 */
  uint64_t refs;             /* live rdt_ref handles of this runtime         */
  uint64_t borrows;          /* borrows other runtimes hold on our objects   */
  uint64_t borrowed_objects; /* other runtimes' objects we hold refs to      */
  uint64_t refs_in_transit;  /* serialized refs within their lease           */
  uint64_t leases_expired;   /* serialized refs never deserialized in time   */
  uint64_t fetches_active;   /* rdt_pending handles (gets, writes) not freed */
  uint64_t transfers_completed;
  uint64_t transfers_failed;
  uint64_t bytes_received;
  uint64_t sends_completed;  /* two-sided sends served as source            */
  uint64_t bytes_sent;
  uint64_t local_copies;     /* fetches of our own objects, copied directly */
  uint64_t peers;            /* runtimes we are connected to                */
  /* Connections to peers that ended without the peer's closing notice: it
   * died, fell silent or stopped reading for peer_timeout_ms, or broke the
   * protocol. A peer that is alive and well never adds to it. */
  uint64_t peers_lost;
  uint64_t writes_completed; /* writes into other runtimes' exposed objects */
  uint64_t writes_failed;
  uint64_t bytes_written;
  uint64_t writes_open;      /* writes into our exposed objects, admitted and not ended */
  uint64_t views_open;       /* views mapping other runtimes' objects, not released */
  uint64_t bytes_viewed;     /* the bytes those views map */
} rdt_stats;

static inline void rdt_stats_init(rdt_stats *stats) {
  memset(stats, 0, sizeof *stats);
  stats->struct_size = (uint32_t)sizeof *stats;
}

/* Copies the runtime's counters into `out` (initialized with _init). */
RDT_API rdt_status rdt_runtime_stats(rdt_runtime *rt, rdt_stats *out);

/* Fetch latency histograms. Every completed fetch of another runtime's
 * object is counted under the transport that moved it and the size class
 * of the object's total bytes: class c < RDT_FETCH_SIZE_CLASSES - 1 holds
 * objects of at most RDT_FETCH_SIZE_CLASS_MAX_BYTES(c) bytes (4 KiB, 64 KiB,
 * 1 MiB, 16 MiB, 256 MiB), the last class every larger object. Its
 * latency, from rdt_get_start() (or rdt_get()) to the end of that
 * object's transfer, is in bucket b < RDT_FETCH_LATENCY_BUCKETS - 1 when it
 * is at most RDT_FETCH_LATENCY_BUCKET_MAX_US(b) microseconds (2^b) and over
 * the bound of bucket b - 1; slower fetches are in the last bucket. Copies
 * of a runtime's own objects (rdt_stats.local_copies) and empty objects
 * move nothing over a transport and are not counted. */
#define RDT_FETCH_SIZE_CLASSES 6
#define RDT_FETCH_SIZE_CLASS_MAX_BYTES(c) ((uint64_t)4096 << (4 * (c)))
#define RDT_FETCH_LATENCY_BUCKETS 25
#define RDT_FETCH_LATENCY_BUCKET_MAX_US(b) ((uint64_t)1 << (b))

typedef struct rdt_fetch_histogram {
  uint32_t struct_size;              /* set by _init */
  uint32_t size_class;               /* 0 .. RDT_FETCH_SIZE_CLASSES - 1 */
  char transport[RDT_NAME_MAX + 1];  /* canonical lower-case name */
  uint64_t count;    /* completed fetches: the sum of buckets[] */
  uint64_t sum_ns;   /* their latencies added up, in nanoseconds */
  uint64_t bytes;    /* their bytes added up */
  uint64_t failures; /* failed fetches over this transport: in no bucket */
  /* Fetches per latency bucket: NOT cumulative (Prometheus' le buckets
   * are the running sums). */
  uint64_t buckets[RDT_FETCH_LATENCY_BUCKETS];
  /* RDT_DIRECTION_GET: gets this runtime received; RDT_DIRECTION_WRITE:
   * writes it made into exposed objects, counted alike (latency from
   * rdt_write_start() or rdt_write()). An array whose struct_size ends
   * before this field is given the get entries only. */
  uint32_t direction;
} rdt_fetch_histogram;

/* Directions of a transfer (rdt_fetch_histogram.direction). */
#define RDT_DIRECTION_GET 0
#define RDT_DIRECTION_WRITE 1

static inline void rdt_fetch_histogram_init(rdt_fetch_histogram *h) {
  memset(h, 0, sizeof *h);
  h->struct_size = (uint32_t)sizeof *h;
}

/* Copies the fetch histograms of `rt` out, one entry per (transport, size
 * class) with at least one fetch or failure, sorted by transport name and
 * size class. *count gets the number of such entries; up to `capacity` are
 * written to `out` (which may be NULL when capacity is 0; call with 0 to
 * size the array, and again if *count grew meanwhile). The array's stride
 * is out[0].struct_size, so initialize every element with
 * rdt_fetch_histogram_init(). The caller owns `out`. Counters only grow, and
 * each is read atomically but not all at one instant, so an entry copied
 * during fetches may count a fetch in buckets[] before sum_ns. Errors:
 * RDT_ERR_INVALID_ARGUMENT for a bad handle, a NULL `count`, a NULL `out`
 * with capacity > 0, or out[0].struct_size too small; RDT_ERR_NO_MEMORY. */
RDT_API rdt_status rdt_runtime_fetch_histograms(rdt_runtime *rt,
                                                rdt_fetch_histogram *out,
                                                size_t capacity,
                                                size_t *count);
/* ------------------------------------------------------------------------- */
/* Log capture                                                               */
/* ------------------------------------------------------------------------- */

/* By default every runtime writes its log lines to stderr. A binding whose
 * users read logs elsewhere (Python's logging) turns capture on and takes
 * the lines from a queue on a thread of its own: rdt never calls into the
 * binding to log. Capture and the level override are process-wide, for
 * every runtime, existing and later. */

/* Longest message a record holds, without the NUL (longer ones are cut,
 * ending in "..."). */
#define RDT_LOG_MESSAGE_MAX 1023
/* Most log lines held while capture is on; when more arrive before they are
 * taken, the oldest are dropped and the next take starts with a warning
 * that says how many. */
#define RDT_LOG_QUEUE_MAX 4096

typedef struct rdt_log_record {
  uint32_t struct_size;                     /* set by _init */
  int32_t level;                            /* RDT_LOG_ERROR .. RDT_LOG_DEBUG */
  int64_t unix_ns;                          /* when it was logged */
  char runtime[RDT_NAME_MAX + 1];           /* the runtime's name, cut to fit */
  char message[RDT_LOG_MESSAGE_MAX + 1];    /* the line, without the prefix */
} rdt_log_record;

static inline void rdt_log_record_init(rdt_log_record *record) {
  memset(record, 0, sizeof *record);
  record->struct_size = (uint32_t)sizeof *record;
}

/* enable != 0: from now on, log lines are held for rdt_log_take() instead of
 * written to stderr. enable == 0: lines go to stderr again; held lines are
 * dropped and waiting rdt_log_take() calls return RDT_ERR_CLOSED. Calling it
 * twice with the same value does nothing. Never fails. */
RDT_API rdt_status rdt_log_capture(int enable);

/* Moves up to `capacity` held log lines, oldest first, into `records` and
 * their number into *count. Waits up to `timeout_ms` (< 0: forever, 0: do
 * not wait) until at least one is held; *count is 0 when the time ran out
 * (not an error). The array's stride is records[0].struct_size, so
 * initialize every element with rdt_log_record_init(). Errors:
 * INVALID_ARGUMENT (NULL records or count, capacity 0, struct_size too
 * small), CLOSED (capture is off, or was turned off while waiting). */
RDT_API rdt_status rdt_log_take(rdt_log_record *records, size_t capacity,
                                size_t *count, int64_t timeout_ms);

/* Sets the log level of every runtime of the process, existing and later,
 * to `level` (RDT_LOG_OFF .. RDT_LOG_DEBUG); RDT_LOG_DEFAULT gives each
 * runtime back its own (rdt_runtime_options.log_level, else $RDT_LOG). A
 * runtime whose own level is RDT_LOG_OFF (by its options or $RDT_LOG=off)
 * stays silent. Errors: INVALID_ARGUMENT (level out of range). */
RDT_API rdt_status rdt_log_set_level(int32_t level);

/* ------------------------------------------------------------------------- */
/* Renamed names                                                             */
/* ------------------------------------------------------------------------- */

/* The names of earlier versions of this header, before its words were made
 * one vocabulary (docs/abi.md, "Vocabulary"). Each still compiles and links,
 * with a deprecation warning naming its replacement: the types are the new
 * types under their old names, and the functions are exported by the
 * library and do exactly what their replacements do. New code uses the new
 * names; these will go in a later major version. */

typedef rdt_pending rdt_fetch RDT_DEPRECATED("use rdt_pending");
typedef rdt_get_options rdt_fetch_options RDT_DEPRECATED("use rdt_get_options");
typedef rdt_range rdt_source_range RDT_DEPRECATED("use rdt_range");

RDT_DEPRECATED("use rdt_get_options_init")
static inline void rdt_fetch_options_init(rdt_get_options *opts) {
  rdt_get_options_init(opts);
}

/* rdt_get_start(). */
RDT_API rdt_status rdt_fetch_start(rdt_runtime *rt, rdt_ref *const *refs,
                                   size_t num_refs, const rdt_tensor *targets,
                                   size_t num_targets,
                                   const rdt_get_options *opts,
                                   rdt_pending **out)
    RDT_DEPRECATED("use rdt_get_start");
/* rdt_pending_wait(). */
RDT_API rdt_status rdt_fetch_wait(rdt_pending *fetch, int64_t timeout_ms)
    RDT_DEPRECATED("use rdt_pending_wait");
/* rdt_pending_abort(). */
RDT_API rdt_status rdt_fetch_abort(rdt_pending *fetch)
    RDT_DEPRECATED("use rdt_pending_abort");
/* rdt_pending_event_fd(). */
RDT_API rdt_status rdt_fetch_event_fd(rdt_pending *fetch, int *fd_out)
    RDT_DEPRECATED("use rdt_pending_event_fd");
/* rdt_pending_free(). */
RDT_API rdt_status rdt_fetch_free(rdt_pending *fetch)
    RDT_DEPRECATED("use rdt_pending_free");
/* rdt_prepare_get(). */
RDT_API rdt_status rdt_fetch_prepare(rdt_runtime *rt, rdt_ref *const *refs,
                                     size_t num_refs, const rdt_tensor *targets,
                                     size_t num_targets,
                                     const rdt_get_options *opts,
                                     rdt_prepared **out)
    RDT_DEPRECATED("use rdt_prepare_get");
/* rdt_prepare_write(). */
RDT_API rdt_status rdt_write_prepare(rdt_runtime *rt, rdt_ref *const *refs,
                                     size_t num_refs, const rdt_tensor *sources,
                                     size_t num_sources,
                                     const rdt_write_options *opts,
                                     rdt_prepared **out)
    RDT_DEPRECATED("use rdt_prepare_write");

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RDT_H */
