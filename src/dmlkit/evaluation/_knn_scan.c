/*
 * Score-tile scan of the exact k-NN engine (dmlkit/evaluation/knn.py, "native tiles").
 *
 * A worker multiplies a tile of search scores s [rows, cols] (bf16 or float32, row-major) and
 * calls scan_tile: every entry above its query's current m-th best goes into that query's
 * running top-m, kept as a binary min-heap (values [N, m] float32, indices [N, m] int64; the
 * root values[q, 0] is the m-th best). In leave-one-out on one tensor (symmetric = 1) the entry
 * (i, j) also serves column j: it is offered to query c0 + j with reference r0 + i.
 * A query's threshold is max(root of its own heap, floor[q]); floor holds the other workers'
 * thresholds at the start of the tile (any of them is a valid lower bound of the merged m-th best).
 *
 * The entries are first compared 32 at a time with min(row threshold, column threshold) in a
 * loop the compiler vectorises; only chunks with a passing entry are visited one entry at a time.
 * bf16 values are compared as 16-bit integers after mapping their bits to an order-preserving key.
 *
 * seed_floor gives the seeding tiles (where the heaps are still empty) a starting threshold: the
 * value just below the m-th largest of a row's chunk maxima, so at least m entries pass it.
 *
 * Both functions release the GIL; the Python side owns all memory (torch tensors) and checks
 * shapes, dtypes and contiguity before calling.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 32

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

/* bf16 bits -> int16 key with the order of the values (-0 sorts just below +0). */
static inline int16_t bf16_key(uint16_t bits) {
    int16_t s = (int16_t)bits;
    return (int16_t)(s ^ ((s >> 15) & 0x7fff));
}

static inline uint16_t key_bf16(int16_t key) { return (uint16_t)(int16_t)(key ^ ((key >> 15) & 0x7fff)); }

static inline float bf16_float(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Key of a float that is a bf16 value (a heap root or floor: scores of bf16 tiles, or -inf). */
static inline int16_t float_key(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return bf16_key((uint16_t)(u >> 16));
}

/* Replace the root of the min-heap (v, ix)[0..m) by (val, id) and restore the heap order. */
static inline void heap_replace(float *v, int64_t *ix, int64_t m, float val, int64_t id) {
    int64_t p = 0;
    for (;;) {
        int64_t l = 2 * p + 1, r = l + 1, s = p;
        float sv = val;
        if (l < m && v[l] < sv) { s = l; sv = v[l]; }
        if (r < m && v[r] < sv) { s = r; sv = v[r]; }
        if (s == p) break;
        v[p] = v[s];
        ix[p] = ix[s];
        p = s;
    }
    v[p] = val;
    ix[p] = id;
}

typedef struct {
    float *values;
    int64_t *indices;
    const float *floor;
    int64_t m;
} Tops;

static inline float threshold(const Tops *t, int64_t q) {
    float a = t->values[q * t->m], b = t->floor[q];
    return a > b ? a : b;
}

/* Offer (reference id, score v) to query q; returns the query's threshold afterwards. */
static inline float offer(const Tops *t, int64_t q, float v, int64_t id) {
    float th = threshold(t, q);
    if (v > th) {
        heap_replace(t->values + q * t->m, t->indices + q * t->m, t->m, v, id);
        th = threshold(t, q);
    }
    return th;
}

/* The value just below the bf16 key k (skipping -0, which equals +0 as a value). */
static inline float bf16_below(int16_t key) {
    int16_t below = (int16_t)(key - 1);
    if (below == -1) below = -2;
    return bf16_float(key_bf16(below));
}

static inline float f32_key(float v) { return v; }
static inline float f32_below(float v) { return nextafterf(v, -INFINITY); }

/*
 * The scan and the seed threshold, written once for both tile types. Scores are compared as keys K
 * with the order of the values: bf16 bits as int16 keys, float32 as itself. Arguments: the tile type
 * T, the key type K, KEY(entry) and VALUE(entry) -> float, THRESHOLD_KEY(float threshold), the key
 * NO_THRESHOLD no entry passes, LOWEST (below every key), KEY_MINUS_INF and BELOW(key) -> float.
 */
#define DEFINE_TILE_FUNCTIONS(SUFFIX, T, K, KEY, VALUE, THRESHOLD_KEY, NO_THRESHOLD, LOWEST, KEY_MINUS_INF, BELOW) \
    /* pass[jj] = entry jj beats its row or its column threshold; whether any does */                             \
    static inline int chunk_pass_##SUFFIX(const T *entries, const K *col_key, K row_key, int64_t n,               \
                                          uint8_t *pass) {                                                       \
        int any = 0;                                                                                             \
        for (int64_t jj = 0; jj < n; jj++) {                                                                     \
            K lo = col_key[jj] < row_key ? col_key[jj] : row_key;                                                \
            pass[jj] = KEY(entries[jj]) > lo;                                                                    \
            any |= pass[jj];                                                                                     \
        }                                                                                                        \
        return any;                                                                                              \
    }                                                                                                            \
                                                                                                                 \
    MULTIVERSION                                                                                                 \
    static void scan_##SUFFIX(const T *tile, int64_t rows, int64_t cols, int64_t r0, int64_t c0, int symmetric,  \
                              const Tops *t, K *col_key) {                                                       \
        for (int64_t j = 0; j < cols; j++)                                                                       \
            col_key[j] = symmetric ? THRESHOLD_KEY(threshold(t, c0 + j)) : NO_THRESHOLD;                         \
        for (int64_t i = 0; i < rows; i++) {                                                                     \
            const T *row = tile + i * cols;                                                                      \
            int64_t q = r0 + i;                                                                                  \
            float th = threshold(t, q);                                                                          \
            K row_key = THRESHOLD_KEY(th);                                                                       \
            for (int64_t j0 = 0; j0 < cols; j0 += CHUNK) {                                                       \
                int64_t n = cols - j0 < CHUNK ? cols - j0 : CHUNK;                                               \
                uint8_t pass[CHUNK];                                                                             \
                /* a constant trip count for full chunks: the compiler vectorises that copy */                   \
                int any = n == CHUNK ? chunk_pass_##SUFFIX(row + j0, col_key + j0, row_key, CHUNK, pass)         \
                                     : chunk_pass_##SUFFIX(row + j0, col_key + j0, row_key, n, pass);            \
                if (!any) continue;                                                                              \
                for (int jj = 0; jj < n; jj++) {                                                                 \
                    if (!pass[jj]) continue;                                                                     \
                    int64_t j = j0 + jj;                                                                         \
                    float v = VALUE(row[j]);                                                                     \
                    if (v > th) {                                                                                \
                        th = offer(t, q, v, c0 + j);                                                             \
                        row_key = THRESHOLD_KEY(th);                                                             \
                    }                                                                                            \
                    if (symmetric && KEY(row[j]) > col_key[j])                                                   \
                        col_key[j] = THRESHOLD_KEY(offer(t, c0 + j, v, q));                                      \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
    }                                                                                                            \
                                                                                                                 \
    /* The (r+1)-th largest of a[0..n) (0-based rank r); reorders a. */                                          \
    static K kth_largest_##SUFFIX(K *a, int64_t n, int64_t r) {                                                  \
        int64_t lo = 0, hi = n - 1;                                                                              \
        while (lo < hi) {                                                                                        \
            K pivot = a[(lo + hi) / 2];                                                                          \
            int64_t i = lo, j = hi;                                                                              \
            while (i <= j) {                                                                                     \
                while (a[i] > pivot) i++;                                                                        \
                while (a[j] < pivot) j--;                                                                        \
                if (i <= j) { K x = a[i]; a[i] = a[j]; a[j] = x; i++; j--; }                                     \
            }                                                                                                    \
            if (r <= j) hi = j;                                                                                  \
            else if (r >= i) lo = i;                                                                             \
            else return a[r];                                                                                    \
        }                                                                                                        \
        return a[r];                                                                                             \
    }                                                                                                            \
                                                                                                                 \
    /* floor[r0 + i] = the largest value below the m-th largest chunk maximum of row i (-inf if the row has    \
     * fewer than m chunks or its m-th chunk maximum is -inf). */                                               \
    MULTIVERSION                                                                                                 \
    static void seed_floor_##SUFFIX(const T *tile, int64_t rows, int64_t cols, int64_t r0, int64_t m,            \
                                    float *floor, K *maxima) {                                                   \
        int64_t chunks = cols / CHUNK;                                                                           \
        for (int64_t i = 0; i < rows; i++) {                                                                     \
            const T *row = tile + i * cols;                                                                      \
            floor[r0 + i] = -INFINITY;                                                                           \
            if (m > chunks) continue;                                                                            \
            for (int64_t c = 0; c < chunks; c++) {                                                               \
                K best = LOWEST;                                                                                 \
                for (int jj = 0; jj < CHUNK; jj++) {                                                             \
                    K k = KEY(row[c * CHUNK + jj]);                                                              \
                    best = k > best ? k : best;                                                                  \
                }                                                                                                \
                maxima[c] = best;                                                                                \
            }                                                                                                    \
            K k = kth_largest_##SUFFIX(maxima, chunks, m - 1);                                                   \
            if (k > KEY_MINUS_INF) floor[r0 + i] = BELOW(k); /* NaN and -inf give no floor */                  \
        }                                                                                                        \
    }

DEFINE_TILE_FUNCTIONS(bf16, uint16_t, int16_t, bf16_key, bf16_float, float_key, INT16_MAX, INT16_MIN,
                      bf16_key(0xff80), bf16_below)
DEFINE_TILE_FUNCTIONS(f32, float, float, f32_key, f32_key, f32_key, INFINITY, -INFINITY, -INFINITY, f32_below)

static void *pointer(Py_ssize_t address) { return (void *)(uintptr_t)address; }

static PyObject *py_scan_tile(PyObject *self, PyObject *args) {
    Py_ssize_t tile, rows, cols, r0, c0, values, indices, m, floor;
    int bf16, symmetric;
    if (!PyArg_ParseTuple(args, "npnnnnpnnnn", &tile, &bf16, &rows, &cols, &r0, &c0, &symmetric, &values, &indices,
                          &m, &floor))
        return NULL;
    if (rows < 0 || cols < 0 || m < 1) {
        PyErr_SetString(PyExc_ValueError, "scan_tile: rows and cols must be >= 0 and m >= 1");
        return NULL;
    }
    void *work = malloc((size_t)(cols > 0 ? cols : 1) * (bf16 ? sizeof(int16_t) : sizeof(float)));
    if (!work) return PyErr_NoMemory();
    Tops t = {pointer(values), pointer(indices), pointer(floor), m};
    Py_BEGIN_ALLOW_THREADS
    if (bf16) scan_bf16(pointer(tile), rows, cols, r0, c0, symmetric, &t, work);
    else scan_f32(pointer(tile), rows, cols, r0, c0, symmetric, &t, work);
    Py_END_ALLOW_THREADS
    free(work);
    Py_RETURN_NONE;
}

static PyObject *py_seed_floor(PyObject *self, PyObject *args) {
    Py_ssize_t tile, rows, cols, r0, m, floor;
    int bf16;
    if (!PyArg_ParseTuple(args, "npnnnnn", &tile, &bf16, &rows, &cols, &r0, &m, &floor)) return NULL;
    if (rows < 0 || cols < 0 || m < 1) {
        PyErr_SetString(PyExc_ValueError, "seed_floor: rows and cols must be >= 0 and m >= 1");
        return NULL;
    }
    Py_ssize_t chunks = cols / CHUNK;
    void *work = malloc((size_t)(chunks > 0 ? chunks : 1) * sizeof(float));
    if (!work) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    if (bf16) seed_floor_bf16(pointer(tile), rows, cols, r0, m, pointer(floor), work);
    else seed_floor_f32(pointer(tile), rows, cols, r0, m, pointer(floor), work);
    Py_END_ALLOW_THREADS
    free(work);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan_tile", py_scan_tile, METH_VARARGS,
     "scan_tile(tile, bf16, rows, cols, r0, c0, symmetric, values, indices, m, floor): offer a score tile's "
     "entries above their thresholds to the running top-m min-heaps (addresses of contiguous tensors)."},
    {"seed_floor", py_seed_floor, METH_VARARGS,
     "seed_floor(tile, bf16, rows, cols, r0, m, floor): floor[r0 + i] = a threshold at least m entries of row i pass."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_knn_scan", "Score-tile scan of the exact k-NN engine.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__knn_scan(void) { return PyModule_Create(&module); }
