/*
 * seer_deploy.runtime._loopcore: the host logic of one denoising step in C.
 *
 * The same functions as the numpy twin in loopcore.py, with the same results bit for bit and the same errors:
 * the transfer schedule, the top-k commit among masked positions of a block, parallel decoding's commit of the
 * ranked candidates that clear per-rank thresholds, the masks-left stop test and the bucket choice. Arrays arrive
 * through the buffer protocol (no numpy C headers at build time; numpy.ndarray is checked by isinstance, as the
 * twin does); new arrays are made by calling numpy.empty. Both are looked up once per module and kept in the module
 * state (no C globals).
 *
 * Order of confidences (shared with the twin and reference.select_transfer): higher first; NaN ranks above every
 * number; -0.0 equals +0.0; ties go to the lower position. Each (confidence, position) pair is mapped to a unique
 * uint64 key whose unsigned order is exactly that order, so the top k are the k largest keys and the ranks of
 * parallel decoding are the keys in descending order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* The module's objects, listed once: numpy.empty, numpy.ndarray, numpy.int64, seer_deploy.core.errors.ConfigError. */
#define STATE_OBJECTS(X) X(np_empty) X(np_ndarray) X(np_int64) X(config_error)
#define STATE_FIELD(name) PyObject *name;

typedef struct {
    STATE_OBJECTS(STATE_FIELD)
} core_state;

static core_state *get_state(PyObject *module) { return (core_state *)PyModule_GetState(module); }

/* ---------------------------------------------------------------- buffers */

typedef enum { KIND_INT64, KIND_FLOAT32 } elem_kind;

/* The format code without a native byte-order prefix, or NULL when the byte order is not native. */
static const char *native_format(const char *fmt) {
    if (fmt == NULL) return "B";
    if (fmt[0] == '@' || fmt[0] == '=') return fmt + 1;
#if PY_BIG_ENDIAN
    if (fmt[0] == '>' || fmt[0] == '!') return fmt + 1;
    if (fmt[0] == '<') return NULL;
#else
    if (fmt[0] == '<') return fmt + 1;
    if (fmt[0] == '>' || fmt[0] == '!') return NULL;
#endif
    return fmt;
}

static int format_matches(const Py_buffer *view, elem_kind kind) {
    const char *f = native_format(view->format);
    if (f == NULL) return 0;
    if (kind == KIND_INT64) return view->itemsize == 8 && (strcmp(f, "l") == 0 || strcmp(f, "q") == 0);
    return view->itemsize == 4 && strcmp(f, "f") == 0;
}

/* The twin's TypeError for a wrong argument: it names the dtype of a numpy array, else the type. Returns -1. */
static int wrong_type(core_state *st, PyObject *obj, const char *name, const char *dtype) {
    int is_array = PyObject_IsInstance(obj, st->np_ndarray);
    if (is_array < 0) return -1;
    PyObject *got = is_array ? PyObject_GetAttrString(obj, "dtype")
                             : PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__name__");
    if (got == NULL) return -1;
    PyErr_Format(PyExc_TypeError, "%s must be a numpy array of dtype %s, got %S", name, dtype, got);
    Py_DECREF(got);
    return -1;
}

/*
 * Get a C-contiguous buffer of a numpy array of `ndim` dimensions and the given element kind; on failure raise
 * TypeError (not a numpy array of that dtype) or ValueError (wrong rank, not contiguous, read-only) naming the
 * argument, with the twin's messages in the twin's order, and return -1.
 */
static int get_array(core_state *st, PyObject *obj, const char *name, elem_kind kind, int ndim, int writable,
                     Py_buffer *view) {
    const char *dtype = kind == KIND_INT64 ? "int64" : "float32";
    int is_array = PyObject_IsInstance(obj, st->np_ndarray);
    if (is_array < 0) return -1;
    if (!is_array) return wrong_type(st, obj, name, dtype);
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return wrong_type(st, obj, name, dtype);
    }
    if (!format_matches(view, kind)) {
        PyBuffer_Release(view);
        return wrong_type(st, obj, name, dtype);
    }
    if (view->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must be %d-D, got %d-D", name, ndim, view->ndim);
        goto fail;
    }
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous; pass numpy.ascontiguousarray(%s)", name, name);
        goto fail;
    }
    if (writable && view->readonly) {
        PyErr_Format(PyExc_ValueError, "%s must be writable (it is updated in place)", name);
        goto fail;
    }
    return 0;
fail:
    PyBuffer_Release(view);
    return -1;
}

/* A new numpy int64 array of the given shape, its data in *data (the array owns it: valid while it lives). NULL with
 * an exception on error. */
static PyObject *new_int64_array(core_state *st, int ndim, const Py_ssize_t *shape, int64_t **data) {
    PyObject *dims = PyTuple_New(ndim);
    if (dims == NULL) return NULL;
    for (int i = 0; i < ndim; i++) {
        PyObject *d = PyLong_FromSsize_t(shape[i]);
        if (d == NULL) {
            Py_DECREF(dims);
            return NULL;
        }
        PyTuple_SET_ITEM(dims, i, d);
    }
    PyObject *kwargs = Py_BuildValue("{sO}", "dtype", st->np_int64);
    PyObject *args = kwargs == NULL ? NULL : PyTuple_Pack(1, dims);
    PyObject *arr = args == NULL ? NULL : PyObject_Call(st->np_empty, args, kwargs);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_DECREF(dims);
    if (arr == NULL) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(arr, &view, PyBUF_RECORDS) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    *data = (int64_t *)view.buf;
    PyBuffer_Release(&view);
    return arr;
}

/* A new int64 array [batch] (a per-row result), its data in *data; NULL on error. */
static PyObject *new_counts(PyObject *module, Py_ssize_t batch, int64_t **data) {
    Py_ssize_t shape[1] = {batch};
    return new_int64_array(get_state(module), 1, shape, data);
}

/* Check 1-D int64 row arguments of length B. */
static int check_rows(const Py_buffer *view, const char *name, Py_ssize_t batch) {
    if (view->shape[0] != batch) {
        PyErr_Format(PyExc_ValueError, "%s has %zd rows but x has %zd; pass one value per row", name,
                     view->shape[0], batch);
        return -1;
    }
    return 0;
}

/* mask_id as the twin reads it: operator.index, then OverflowError '<v> does not fit in int64'. -1 on error. */
static int int64_arg(PyObject *obj, long long *out) {
    PyObject *idx = PyNumber_Index(obj);
    if (idx == NULL) return -1;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(idx, &overflow);
    if (overflow) PyErr_Format(PyExc_OverflowError, "%S does not fit in int64", idx);
    Py_DECREF(idx);
    return overflow || (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* x0 and the scores (v[1], v[2]) have x's (v[0]) shape; else ValueError naming the first that differs. */
static int check_same_shape(const Py_buffer *v, const char *const *names) {
    for (int i = 1; i < 3; i++) {
        if (v[i].shape[0] != v[0].shape[0] || v[i].shape[1] != v[0].shape[1]) {
            PyErr_Format(PyExc_ValueError, "%s has shape [%zd, %zd] but x has [%zd, %zd]; they must match", names[i],
                         v[i].shape[0], v[i].shape[1], v[0].shape[0], v[0].shape[1]);
            return -1;
        }
    }
    return 0;
}

static int check_block(const int64_t *lo, const int64_t *hi, Py_ssize_t batch, Py_ssize_t seq) {
    for (Py_ssize_t b = 0; b < batch; b++) {
        if (lo[b] < 0 || lo[b] > hi[b] || hi[b] > (int64_t)seq) {
            PyErr_Format(PyExc_ValueError,
                         "row %zd: block [%lld, %lld) is not inside [0, %zd]; need 0 <= block_lo <= block_hi <= S",
                         b, (long long)lo[b], (long long)hi[b], seq);
            return -1;
        }
    }
    return 0;
}

/* Release the first `n` buffers of `v`. */
static void release_all(Py_buffer *v, int n) {
    for (int i = 0; i < n; i++) PyBuffer_Release(&v[i]);
}

/* ---------------------------------------------------------------- transfer_schedule */

static PyObject *transfer_schedule(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"n_masked", "steps", NULL};
    PyObject *n_obj;
    Py_ssize_t steps;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On:transfer_schedule", kwlist, &n_obj, &steps)) return NULL;
    if (steps < 1) return PyErr_Format(PyExc_ValueError, "steps must be >= 1, got %zd", steps);
    Py_buffer n_view;
    if (get_array(get_state(module), n_obj, "n_masked", KIND_INT64, 1, 0, &n_view) < 0) return NULL;
    const int64_t *n = (const int64_t *)n_view.buf;
    Py_ssize_t batch = n_view.shape[0];
    for (Py_ssize_t b = 0; b < batch; b++) {
        if (n[b] < 0) {
            PyBuffer_Release(&n_view);
            return PyErr_Format(PyExc_ValueError, "n_masked[%zd] is %lld; counts must be >= 0", b, (long long)n[b]);
        }
    }
    Py_ssize_t shape[2] = {batch, steps};
    int64_t *o;
    PyObject *out = new_int64_array(get_state(module), 2, shape, &o);
    for (Py_ssize_t b = 0; out != NULL && b < batch; b++) {
        int64_t base = n[b] / steps, rem = n[b] % steps;
        for (Py_ssize_t i = 0; i < steps; i++) o[b * steps + i] = base + (i < rem ? 1 : 0);
    }
    PyBuffer_Release(&n_view);
    return out;
}

/* ---------------------------------------------------------------- commit_step */

/* Map a confidence to a uint32 whose unsigned order is the confidence order (NaN highest, -0.0 == +0.0). */
static inline uint32_t confidence_key(float c) {
    if (c != c) return UINT32_MAX;
    if (c == 0.0f) c = 0.0f;
    uint32_t bits;
    memcpy(&bits, &c, sizeof bits);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

/* A unique key per candidate: confidence first, then the lower position wins. */
static inline uint64_t order_key(float c, Py_ssize_t pos) {
    return ((uint64_t)confidence_key(c) << 32) | (uint64_t)(UINT32_MAX - (uint32_t)pos);
}

static inline void sift_down(uint64_t *heap, Py_ssize_t n, Py_ssize_t i) {
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap[l] < heap[m]) m = l;
        if (r < n && heap[r] < heap[m]) m = r;
        if (m == i) return;
        uint64_t t = heap[i];
        heap[i] = heap[m];
        heap[m] = t;
        i = m;
    }
}

/* Commit one row; `heap` has room for S keys. Returns the number committed. */
static int64_t commit_row(int64_t *x, const int64_t *x0, const float *conf, Py_ssize_t lo, Py_ssize_t hi, int64_t k,
                          int64_t mask_id, uint64_t *heap) {
    if (k <= 0) return 0;
    Py_ssize_t n_cand = 0;
    for (Py_ssize_t p = lo; p < hi; p++) n_cand += x[p] == mask_id;
    if (k >= n_cand) {
        for (Py_ssize_t p = lo; p < hi; p++)
            if (x[p] == mask_id) x[p] = x0[p];
        return n_cand;
    }
    /* A min-heap of the k best keys seen so far: O(S log k), exact because keys are unique. */
    Py_ssize_t size = 0;
    for (Py_ssize_t p = lo; p < hi; p++) {
        if (x[p] != mask_id) continue;
        uint64_t key = order_key(conf[p], p);
        if (size < k) {
            Py_ssize_t i = size++;
            heap[i] = key;
            while (i > 0 && heap[(i - 1) / 2] > heap[i]) {
                uint64_t t = heap[i];
                heap[i] = heap[(i - 1) / 2];
                heap[(i - 1) / 2] = t;
                i = (i - 1) / 2;
            }
        } else if (key > heap[0]) {
            heap[0] = key;
            sift_down(heap, size, 0);
        }
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        Py_ssize_t p = (Py_ssize_t)(UINT32_MAX - (uint32_t)(heap[i] & UINT32_MAX));
        x[p] = x0[p];
    }
    return size;
}

/*
 * What both commit rules take and check alike: x, x0 and the confidence [B, S], a rule array (k [B] or thresholds
 * [ranks]) and the block bounds [B], in `v` in the order they are checked (the twin's), the bounds at `lo_at` and
 * `lo_at + 1`; the counts they return [B] and a heap of `heap_len` keys.
 */
typedef struct {
    Py_buffer v[6];
    int got;
    Py_ssize_t batch, seq;
    const int64_t *lo, *hi;
    long long mask_id;
    PyObject *out;
    int64_t *counts;
    uint64_t *heap;
} commit_call;

/* How one commit rule reads its arguments: the parse format and keywords, the checked order (`slot[i]`: where keyword
 * i lands), the kinds in that order, where the block bounds start, and the first of the 1-D arrays that hold one value
 * per row (the others are per rank). */
typedef struct {
    const char *format;
    char *kwlist[8];
    int slot[6];
    elem_kind kinds[6];
    int lo_at, rows_from;
} commit_spec;

/* Parse and check the arguments into `c`; -1 on error, with `c` still to be closed. */
static int open_commit(PyObject *module, PyObject *args, PyObject *kwargs, const commit_spec *spec, commit_call *c) {
    static const int ndims[6] = {2, 2, 2, 1, 1, 1};
    PyObject *objs[6], *mask_obj;
    const char *names[6];
    for (int i = 0; i < 6; i++) names[spec->slot[i]] = spec->kwlist[i];
    c->got = 0;
    c->out = NULL;
    c->heap = NULL;
    const int *at = spec->slot;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, spec->format, (char **)spec->kwlist, &objs[at[0]], &objs[at[1]],
                                     &objs[at[2]], &objs[at[3]], &objs[at[4]], &objs[at[5]], &mask_obj))
        return -1;
    if (int64_arg(mask_obj, &c->mask_id) < 0) return -1;
    for (; c->got < 6; c->got++)
        if (get_array(get_state(module), objs[c->got], names[c->got], spec->kinds[c->got], ndims[c->got],
                      c->got == 0, &c->v[c->got]) < 0)
            return -1;
    c->batch = c->v[0].shape[0];
    c->seq = c->v[0].shape[1];
    if (check_same_shape(c->v, names) < 0) return -1;
    for (int i = spec->rows_from; i < 6; i++)
        if (check_rows(&c->v[i], names[i], c->batch) < 0) return -1;
    if ((uint64_t)c->seq > (uint64_t)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "sequence length %zd is too long (at most 2**32 - 1)", c->seq);
        return -1;
    }
    c->lo = (const int64_t *)c->v[spec->lo_at].buf;
    c->hi = (const int64_t *)c->v[spec->lo_at + 1].buf;
    return check_block(c->lo, c->hi, c->batch, c->seq);
}

/* The counts array [B] and a heap of `heap_len` keys (at least 1; none for -1); -1 on error. */
static int commit_buffers(PyObject *module, Py_ssize_t heap_len, commit_call *c) {
    c->out = new_counts(module, c->batch, &c->counts);
    if (c->out == NULL) return -1;
    if (heap_len < 0) return 0;
    c->heap = PyMem_Malloc((size_t)(heap_len > 0 ? heap_len : 1) * sizeof(uint64_t));
    if (c->heap == NULL) {
        Py_CLEAR(c->out);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Release what `c` holds; its counts array (a new reference), or NULL where it failed. */
static PyObject *close_commit(commit_call *c) {
    PyMem_Free(c->heap);
    release_all(c->v, c->got);
    return c->out;
}

/* The three commit rules' arguments, each checked in the twin's order: x, x0, the scores, the rule's array, then the
 * block bounds. commit_step's k and commit_above's threshold hold one value per row, commit_confident's thresholds
 * one per rank. */
static const commit_spec COMMIT_STEP = {
    "OOOOOOO:commit_step", {"x", "x0", "confidence", "block_lo", "block_hi", "k", "mask_id", NULL},
    {0, 1, 2, 3, 4, 5}, {KIND_INT64, KIND_INT64, KIND_FLOAT32, KIND_INT64, KIND_INT64, KIND_INT64}, 3, 3};
static const commit_spec COMMIT_CONFIDENT = {
    "OOOOOOO:commit_confident", {"x", "x0", "confidence", "block_lo", "block_hi", "thresholds", "mask_id", NULL},
    {0, 1, 2, 4, 5, 3}, {KIND_INT64, KIND_INT64, KIND_FLOAT32, KIND_FLOAT32, KIND_INT64, KIND_INT64}, 4, 4};
static const commit_spec COMMIT_ABOVE = {
    "OOOOOOO:commit_above", {"x", "x0", "score", "block_lo", "block_hi", "threshold", "mask_id", NULL},
    {0, 1, 2, 4, 5, 3}, {KIND_INT64, KIND_INT64, KIND_FLOAT32, KIND_FLOAT32, KIND_INT64, KIND_INT64}, 4, 3};

static PyObject *commit_step(PyObject *module, PyObject *args, PyObject *kwargs) {
    commit_call c;
    if (open_commit(module, args, kwargs, &COMMIT_STEP, &c) < 0) return close_commit(&c);
    const int64_t *k = (const int64_t *)c.v[5].buf;
    for (Py_ssize_t b = 0; b < c.batch; b++) {
        if (k[b] < 0) {
            PyErr_Format(PyExc_ValueError, "k[%zd] is %lld; the number to commit must be >= 0", b, (long long)k[b]);
            return close_commit(&c);
        }
    }
    if (commit_buffers(module, c.seq, &c) < 0) return close_commit(&c);
    int64_t *x = (int64_t *)c.v[0].buf, *counts = c.counts;
    const int64_t *x0 = (const int64_t *)c.v[1].buf;
    const float *conf = (const float *)c.v[2].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < c.batch; b++)
        counts[b] = commit_row(x + b * c.seq, x0 + b * c.seq, conf + b * c.seq, (Py_ssize_t)c.lo[b],
                               (Py_ssize_t)c.hi[b], k[b], (int64_t)c.mask_id, c.heap);
    Py_END_ALLOW_THREADS
    return close_commit(&c);
}

/* ---------------------------------------------------------------- commit_confident */

/*
 * Commit one row under parallel decoding's rule; `heap` has room for hi - lo keys. The complemented keys in a
 * min-heap are the keys in a max-heap: built in O(m) for m candidates, then popped best first (rank 0, 1, ...)
 * until a rank r >= 1 has confidence < thresholds[r] (NaN fails): O(m + n log m) for n committed.
 */
static int64_t confident_row(int64_t *x, const int64_t *x0, const float *conf, Py_ssize_t lo, Py_ssize_t hi,
                             const float *thresholds, int64_t mask_id, uint64_t *heap) {
    Py_ssize_t size = 0;
    for (Py_ssize_t p = lo; p < hi; p++)
        if (x[p] == mask_id) heap[size++] = ~order_key(conf[p], p);
    for (Py_ssize_t i = size / 2; i-- > 0;) sift_down(heap, size, i);
    int64_t n = 0;
    while (size > 0) {
        uint64_t key = ~heap[0];
        Py_ssize_t p = (Py_ssize_t)(UINT32_MAX - (uint32_t)(key & UINT32_MAX));
        if (n > 0 && !(conf[p] >= thresholds[n])) break;
        x[p] = x0[p];
        n++;
        heap[0] = heap[--size];
        sift_down(heap, size, 0);
    }
    return n;
}

static PyObject *commit_confident(PyObject *module, PyObject *args, PyObject *kwargs) {
    commit_call c;
    if (open_commit(module, args, kwargs, &COMMIT_CONFIDENT, &c) < 0) return close_commit(&c);
    Py_ssize_t widest = 0, n_thresholds = c.v[3].shape[0];
    for (Py_ssize_t b = 0; b < c.batch; b++)
        if ((Py_ssize_t)(c.hi[b] - c.lo[b]) > widest) widest = (Py_ssize_t)(c.hi[b] - c.lo[b]);
    if (widest > n_thresholds) {
        PyErr_Format(PyExc_ValueError,
                     "thresholds has %zd ranks but a block spans %zd positions; give one threshold per rank of the "
                     "widest block",
                     n_thresholds, widest);
        return close_commit(&c);
    }
    if (commit_buffers(module, widest, &c) < 0) return close_commit(&c);
    int64_t *x = (int64_t *)c.v[0].buf, *counts = c.counts;
    const int64_t *x0 = (const int64_t *)c.v[1].buf;
    const float *conf = (const float *)c.v[2].buf, *thresholds = (const float *)c.v[3].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < c.batch; b++)
        counts[b] = confident_row(x + b * c.seq, x0 + b * c.seq, conf + b * c.seq, (Py_ssize_t)c.lo[b],
                                  (Py_ssize_t)c.hi[b], thresholds, (int64_t)c.mask_id, c.heap);
    Py_END_ALLOW_THREADS
    return close_commit(&c);
}

/* ---------------------------------------------------------------- masks_left */

static PyObject *masks_left(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"x", "block_lo", "block_hi", "mask_id", NULL};
    PyObject *objs[3], *mask_obj;
    long long mask_id;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:masks_left", kwlist, &objs[0], &objs[1], &objs[2],
                                     &mask_obj))
        return NULL;
    if (int64_arg(mask_obj, &mask_id) < 0) return NULL;
    static const char *names[3] = {"x", "block_lo", "block_hi"};
    Py_buffer v[3];
    int got = 0;
    PyObject *out = NULL;
    for (; got < 3; got++)
        if (get_array(get_state(module), objs[got], names[got], KIND_INT64, got == 0 ? 2 : 1, 0, &v[got]) < 0)
            goto done;
    Py_ssize_t batch = v[0].shape[0], seq = v[0].shape[1];
    if (check_rows(&v[1], names[1], batch) < 0 || check_rows(&v[2], names[2], batch) < 0) goto done;
    const int64_t *x = (const int64_t *)v[0].buf, *lo = (const int64_t *)v[1].buf, *hi = (const int64_t *)v[2].buf;
    if (check_block(lo, hi, batch, seq) < 0) goto done;
    int64_t *counts;
    out = new_counts(module, batch, &counts);
    for (Py_ssize_t b = 0; out != NULL && b < batch; b++) {
        int64_t n = 0;
        for (int64_t p = lo[b]; p < hi[b]; p++) n += x[b * seq + p] == (int64_t)mask_id;
        counts[b] = n;
    }
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return out;
}

/* ---------------------------------------------------------------- choose_bucket */

static PyObject *choose_bucket(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"length", "buckets", NULL};
    PyObject *length_obj, *buckets_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:choose_bucket", kwlist, &length_obj, &buckets_obj))
        return NULL;
    core_state *st = get_state(module);
    PyObject *idx = PyNumber_Index(length_obj);
    if (idx == NULL) return NULL;
    long long length = PyLong_AsLongLong(idx);
    Py_DECREF(idx);
    if (length == -1 && PyErr_Occurred()) return NULL;
    if (length < 0) return PyErr_Format(st->config_error, "length %lld is negative; lengths are >= 0", length);
    PyObject *seq = PySequence_Fast(buckets_obj, "buckets must be a sequence of ints");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n == 0) {
        Py_DECREF(seq);
        return PyErr_Format(st->config_error, "no length buckets given; build the engine with at least one bucket");
    }
    Py_ssize_t best = -1;
    long long best_value = 0, largest = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyNumber_Index(PySequence_Fast_GET_ITEM(seq, i));
        if (item == NULL) {
            Py_DECREF(seq);
            return NULL;
        }
        long long value = PyLong_AsLongLong(item);
        Py_DECREF(item);
        if (value == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        if (value < 1) {
            Py_DECREF(seq);
            return PyErr_Format(st->config_error, "bucket %zd is %lld; buckets must be positive lengths", i, value);
        }
        if (value > largest) largest = value;
        if (value >= length && (best < 0 || value < best_value)) {
            best = i;
            best_value = value;
        }
    }
    Py_DECREF(seq);
    if (best < 0)
        return PyErr_Format(st->config_error,
                            "length %lld does not fit the largest bucket (%lld); rebuild the engine with a bucket "
                            ">= %lld or lower gen_length",
                            length, largest, length);
    return PyLong_FromSsize_t(best);
}

/* ---------------------------------------------------------------- the Dream family's sampler */

/* Get `n` arrays by name/kind/rank (the first writable when `first_writable`), the twin's order; -1 on error. */
static int get_arrays(PyObject *module, PyObject **objs, const char *const *names, const elem_kind *kinds,
                      const int *ndims, int n, int first_writable, Py_buffer *v) {
    for (int i = 0; i < n; i++) {
        if (get_array(get_state(module), objs[i], names[i], kinds[i], ndims[i], first_writable && i == 0, &v[i]) < 0) {
            release_all(v, i);
            return -1;
        }
    }
    return 0;
}

static PyObject *timestep_transfer(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"n_masked", "ratio", NULL};
    PyObject *objs[2];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:timestep_transfer", kwlist, &objs[0], &objs[1])) return NULL;
    static const char *const names[2] = {"n_masked", "ratio"};
    static const elem_kind kinds[2] = {KIND_INT64, KIND_FLOAT32};
    static const int ndims[2] = {1, 1};
    Py_buffer v[2];
    if (get_arrays(module, objs, names, kinds, ndims, 2, 0, v) < 0) return NULL;
    PyObject *out = NULL;
    Py_ssize_t batch = v[0].shape[0];
    const int64_t *n = (const int64_t *)v[0].buf;
    const float *r = (const float *)v[1].buf;
    if (check_rows(&v[1], names[1], batch) < 0) goto done;
    for (Py_ssize_t b = 0; b < batch; b++) {
        if (n[b] < 0 || !(r[b] >= 0.0f && r[b] <= 1.0f)) {
            PyErr_SetString(PyExc_ValueError,
                            "n_masked must be >= 0 and ratio in [0, 1] (1 - s / t of two timesteps)");
            goto done;
        }
    }
    int64_t *k;
    out = new_counts(module, batch, &k);
    for (Py_ssize_t b = 0; out != NULL && b < batch; b++) {
        float product = (float)n[b] * r[b]; /* float32, as torch multiplies a float32 count by 1 - s / t */
        int64_t count = (int64_t)product;
        k[b] = count < n[b] ? count : n[b];
    }
done:
    release_all(v, 2);
    return out;
}

/* Dimple's fallback count for one row (see reanchored_transfer). */
static int64_t reanchored_row(int64_t n, int64_t total, int64_t step, const float *ts, int64_t steps) {
    float t = (float)n / (float)total, last = ts[steps];
    if (n == 0 || !(t > last)) return n;
    int64_t start = 0;
    while (!(ts[start] < t)) start++;
    if (start < step + 1) start = step + 1;
    for (int64_t j = start; j < steps; j++) {
        float s = ts[j];
        int64_t k = s > last ? (int64_t)((float)n * (1.0f - s / t)) : n;
        if (k >= 1) return k;
    }
    return n;
}

static PyObject *reanchored_transfer(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"n_current", "n_total", "step", "timesteps", "steps", NULL};
    PyObject *objs[5];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:reanchored_transfer", kwlist, &objs[0], &objs[1], &objs[2],
                                     &objs[3], &objs[4]))
        return NULL;
    static const char *const names[5] = {"n_current", "n_total", "step", "timesteps", "steps"};
    static const elem_kind kinds[5] = {KIND_INT64, KIND_INT64, KIND_INT64, KIND_FLOAT32, KIND_INT64};
    static const int ndims[5] = {1, 1, 1, 2, 1};
    Py_buffer v[5];
    if (get_arrays(module, objs, names, kinds, ndims, 5, 0, v) < 0) return NULL;
    PyObject *out = NULL;
    Py_ssize_t batch = v[0].shape[0], width = v[3].shape[1];
    const int64_t *n = (const int64_t *)v[0].buf, *total = (const int64_t *)v[1].buf, *step = (const int64_t *)v[2].buf;
    const int64_t *steps = (const int64_t *)v[4].buf;
    const float *ts = (const float *)v[3].buf;
    for (int i = 1; i < 5; i++)
        if (check_rows(&v[i], names[i], batch) < 0) goto done;
    for (Py_ssize_t b = 0; b < batch; b++) {
        if (!(steps[b] >= 1 && steps[b] < width && step[b] >= 0 && step[b] < steps[b] && n[b] >= 0 &&
              total[b] >= n[b] && total[b] >= 1)) {
            PyErr_SetString(PyExc_ValueError, "need 0 <= step < steps < timesteps' width and 0 <= n_current <= "
                                              "n_total, n_total >= 1");
            goto done;
        }
    }
    int64_t *k;
    out = new_counts(module, batch, &k);
    for (Py_ssize_t b = 0; out != NULL && b < batch; b++)
        k[b] = reanchored_row(n[b], total[b], step[b], ts + b * width, steps[b]);
done:
    release_all(v, 5);
    return out;
}

static PyObject *commit_above(PyObject *module, PyObject *args, PyObject *kwargs) {
    commit_call c;
    if (open_commit(module, args, kwargs, &COMMIT_ABOVE, &c) < 0 || commit_buffers(module, -1, &c) < 0)
        return close_commit(&c);
    int64_t *x = (int64_t *)c.v[0].buf, *counts = c.counts;
    const int64_t *x0 = (const int64_t *)c.v[1].buf;
    const float *score = (const float *)c.v[2].buf, *threshold = (const float *)c.v[3].buf;
    for (Py_ssize_t b = 0; b < c.batch; b++) {
        int64_t committed = 0;
        for (int64_t p = c.lo[b]; p < c.hi[b]; p++) {
            Py_ssize_t at = b * c.seq + (Py_ssize_t)p;
            if (x[at] == (int64_t)c.mask_id && score[at] > threshold[b]) {
                x[at] = x0[at];
                committed++;
            }
        }
        counts[b] = committed;
    }
    return close_commit(&c);
}

/* ---------------------------------------------------------------- module */

/* One keyword-taking function of this module, under its own name. */
#define METHOD(name, doc) {#name, (PyCFunction)(void (*)(void))name, METH_VARARGS | METH_KEYWORDS, doc}

static PyMethodDef core_methods[] = {
    METHOD(transfer_schedule,
     "transfer_schedule(n_masked: int64[B], steps) -> int64[B, steps]: even split, remainder to the first steps."),
    METHOD(commit_step,
     "commit_step(x, x0, confidence, block_lo, block_hi, k, mask_id) -> int64[B]: commit the k[b] most confident "
     "masked positions of [block_lo[b], block_hi[b]) in place; returns the number committed per row."),
    METHOD(commit_confident,
     "commit_confident(x, x0, confidence, block_lo, block_hi, thresholds, mask_id) -> int64[B]: parallel decoding's "
     "commit. Per row, rank the masked positions of [block_lo[b], block_hi[b]) (higher confidence first, NaN first, "
     "-0.0 == +0.0, ties to the lower position) and commit, in place, ranks 0..n-1 for the largest n such that every "
     "rank r >= 1 has confidence >= thresholds[r] (rank 0 always). thresholds: float32[T], T >= the widest block. "
     "Returns the number committed per row."),
    METHOD(masks_left,
     "masks_left(x, block_lo, block_hi, mask_id) -> int64[B]: masked positions left in each row's block."),
    METHOD(choose_bucket,
     "choose_bucket(length, buckets) -> int: index of the smallest bucket >= length (ConfigError if none)."),
    METHOD(timestep_transfer,
     "timestep_transfer(n_masked: int64[B], ratio: float32[B]) -> int64[B]: Dream's count int(float32(n) * ratio), "
     "at most n."),
    METHOD(reanchored_transfer,
     "reanchored_transfer(n_current, n_total, step, timesteps: float32[B, W], steps) -> int64[B]: Dimple's fallback "
     "count, the schedule re-anchored at the current mask ratio (at least one)."),
    METHOD(commit_above,
     "commit_above(x, x0, score, block_lo, block_hi, threshold: float32[B], mask_id) -> int64[B]: commit, in place, "
     "every masked position of [block_lo[b], block_hi[b]) whose score is > threshold[b]."),
    {NULL, NULL, 0, NULL},
};

static int core_exec(PyObject *module) {
    core_state *st = get_state(module);
    PyObject *numpy = PyImport_ImportModule("numpy");
    if (numpy == NULL) return -1;
    st->np_empty = PyObject_GetAttrString(numpy, "empty");
    st->np_ndarray = PyObject_GetAttrString(numpy, "ndarray");
    st->np_int64 = PyObject_GetAttrString(numpy, "int64");
    Py_DECREF(numpy);
    if (st->np_empty == NULL || st->np_ndarray == NULL || st->np_int64 == NULL) return -1;
    PyObject *errors = PyImport_ImportModule("seer_deploy.core.errors");
    if (errors == NULL) return -1;
    st->config_error = PyObject_GetAttrString(errors, "ConfigError");
    Py_DECREF(errors);
    if (st->config_error == NULL) return -1;
    return PyModule_AddStringConstant(module, "CORE_NAME", "c");
}

static int core_traverse(PyObject *module, visitproc visit, void *arg) {
    core_state *st = get_state(module);
#define STATE_VISIT(name) Py_VISIT(st->name);
    STATE_OBJECTS(STATE_VISIT)
    return 0;
}

static int core_clear(PyObject *module) {
    core_state *st = get_state(module);
#define STATE_CLEAR(name) Py_CLEAR(st->name);
    STATE_OBJECTS(STATE_CLEAR)
    return 0;
}

static void core_free(void *module) { core_clear((PyObject *)module); }

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, (void *)core_exec},
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "seer_deploy.runtime._loopcore",
    .m_doc = "The C core of the denoising loop's host logic (see seer_deploy/runtime/loopcore.py for the twin).",
    .m_size = sizeof(core_state),
    .m_methods = core_methods,
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
    .m_free = core_free,
};

PyMODINIT_FUNC PyInit__loopcore(void) { return PyModuleDef_Init(&core_module); }
