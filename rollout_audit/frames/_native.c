/* The audit's native core: hot loops over a whole batch in one call, with the GIL released.
 *
 * prefix_sha256(data, lo, hi, first, out): SHA-256 (FIPS 180-4) of consecutive prefixes. For
 * each i, a new running hash starts where first[i] is set, is fed data[lo[i]:hi[i]], and the
 * digest of everything fed so far is written to out[32*i:32*i+32] (the running state goes on:
 * the digest is taken on a copy). It is what hashlib gives for the same calls, as one call per
 * batch instead of two per turn. The compression function uses the SHA extensions of x86 CPUs
 * when the CPU has them (checked once with cpuid) and portable C otherwise.
 *
 * Built by hatch_build.py with the machine's C compiler and Python's headers; the package
 * falls back to hashlib when this module is absent (rollout_audit/frames/native.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t H0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

typedef void (*compress_fn)(uint32_t state[8], const uint8_t *blocks, size_t n);

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void compress_c(uint32_t state[8], const uint8_t *p, size_t n) {
    uint32_t w[64];
    while (n--) {
        for (int t = 0; t < 16; t++)
            w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 |
                   (uint32_t)p[4 * t + 3];
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = ROTR(w[t - 15], 7) ^ ROTR(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = ROTR(w[t - 2], 17) ^ ROTR(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        for (int t = 0; t < 64; t++) {
            uint32_t t1 = h + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
            uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        state[0] += a;
        state[1] += b;
        state[2] += c;
        state[3] += d;
        state[4] += e;
        state[5] += f;
        state[6] += g;
        state[7] += h;
        p += 64;
    }
}

#ifdef HAVE_X86
/* The SHA extensions keep the state as two registers, (A, B, E, F) and (C, D, G, H); two rounds
 * per sha256rnds2, the message schedule four words at a time with sha256msg1/sha256msg2. */
__attribute__((target("sha,sse4.1,ssse3"))) static void compress_shani(uint32_t state[8], const uint8_t *p, size_t n) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i dcba = _mm_loadu_si128((const __m128i *)&state[0]);
    __m128i hgfe = _mm_loadu_si128((const __m128i *)&state[4]);
    __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
    __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
    while (n--) {
        __m128i save0 = abef, save1 = cdgh, w[16];
        for (int i = 0; i < 4; i++)
            w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), bswap);
        for (int i = 4; i < 16; i++) {
            __m128i t = _mm_sha256msg1_epu32(w[i - 4], w[i - 3]);
            t = _mm_add_epi32(t, _mm_alignr_epi8(w[i - 1], w[i - 2], 4));
            w[i] = _mm_sha256msg2_epu32(t, w[i - 1]);
        }
        for (int i = 0; i < 16; i++) {
            __m128i m = _mm_add_epi32(w[i], _mm_loadu_si128((const __m128i *)&K[4 * i]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, m);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(m, 0x0E));
        }
        abef = _mm_add_epi32(abef, save0);
        cdgh = _mm_add_epi32(cdgh, save1);
        p += 64;
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)&state[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)&state[4], _mm_alignr_epi8(dchg, feba, 8));
}

static int cpu_has_sha(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19)) || !(c & (1u << 9)))  /* SSE4.1, SSSE3 */
        return 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1;  /* SHA */
}
#endif

static compress_fn compress = compress_c;

typedef struct {
    uint32_t h[8];
    uint8_t buf[64];
    size_t fill;
    uint64_t total;
} sha_ctx;

static void sha_init(sha_ctx *s) {
    memcpy(s->h, H0, sizeof H0);
    s->fill = 0;
    s->total = 0;
}

static void sha_update(sha_ctx *s, const uint8_t *p, size_t n) {
    s->total += n;
    if (s->fill) {
        size_t k = 64 - s->fill < n ? 64 - s->fill : n;
        memcpy(s->buf + s->fill, p, k);
        s->fill += k;
        p += k;
        n -= k;
        if (s->fill < 64)
            return;
        compress(s->h, s->buf, 1);
        s->fill = 0;
    }
    if (n >= 64) {
        compress(s->h, p, n / 64);
        p += n & ~(size_t)63;
        n &= 63;
    }
    memcpy(s->buf, p, n);
    s->fill = n;
}

/* The digest of what `s` was fed, leaving `s` as it was. */
static void sha_digest(const sha_ctx *s, uint8_t out[32]) {
    uint32_t h[8];
    uint8_t tail[128];
    size_t n = s->fill, pad = n < 56 ? 64 : 128;
    memcpy(h, s->h, sizeof h);
    memcpy(tail, s->buf, n);
    memset(tail + n, 0, pad - n);
    tail[n] = 0x80;
    uint64_t bits = s->total * 8;
    for (int i = 0; i < 8; i++)
        tail[pad - 1 - i] = (uint8_t)(bits >> (8 * i));
    compress(h, tail, pad / 64);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(h[i] >> 8);
        out[4 * i + 3] = (uint8_t)h[i];
    }
}

static int get_buffer(PyObject *obj, Py_buffer *view, int flags, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (itemsize && view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected, got %zd", name, itemsize, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *prefix_sha256(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_data, *o_lo, *o_hi, *o_first, *o_out;
    if (!PyArg_ParseTuple(args, "OOOOO", &o_data, &o_lo, &o_hi, &o_first, &o_out))
        return NULL;
    Py_buffer data, lo, hi, first, out;
    if (get_buffer(o_data, &data, PyBUF_SIMPLE, 0, "data") < 0)
        return NULL;
    if (get_buffer(o_lo, &lo, PyBUF_FORMAT, 8, "lo") < 0)
        goto e0;
    if (get_buffer(o_hi, &hi, PyBUF_FORMAT, 8, "hi") < 0)
        goto e1;
    if (get_buffer(o_first, &first, PyBUF_FORMAT, 1, "first") < 0)
        goto e2;
    if (get_buffer(o_out, &out, PyBUF_WRITABLE, 0, "out") < 0)
        goto e3;
    Py_ssize_t n = lo.len / 8;
    if (hi.len / 8 != n || first.len != n || out.len != 32 * n) {
        PyErr_SetString(PyExc_ValueError, "lo, hi, first and out (32 bytes each) must describe as many prefixes");
        goto e4;
    }
    const int64_t *plo = lo.buf, *phi = hi.buf;
    const uint8_t *pf = first.buf, *pd = data.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (plo[i] < 0 || plo[i] > phi[i] || phi[i] > data.len) {
            PyErr_Format(PyExc_ValueError, "prefix %zd: [%lld, %lld) is not inside %zd bytes", i, (long long)plo[i],
                         (long long)phi[i], data.len);
            goto e4;
        }
    Py_BEGIN_ALLOW_THREADS;
    sha_ctx s;
    sha_init(&s);
    uint8_t *po = out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pf[i])
            sha_init(&s);
        sha_update(&s, pd + plo[i], (size_t)(phi[i] - plo[i]));
        sha_digest(&s, po + 32 * i);
    }
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&out);
    PyBuffer_Release(&first);
    PyBuffer_Release(&hi);
    PyBuffer_Release(&lo);
    PyBuffer_Release(&data);
    Py_RETURN_NONE;
e4:
    PyBuffer_Release(&out);
e3:
    PyBuffer_Release(&first);
e2:
    PyBuffer_Release(&hi);
e1:
    PyBuffer_Release(&lo);
e0:
    PyBuffer_Release(&data);
    return NULL;
}

/* token_counts(n_tok, source, mask, lp, lp_present, out): per row, how many of its tokens fall
 * in each category source (0..5) x trainable (0, 1) x log-prob state (0 none, 1 finite and <= 0,
 * 2 NaN, infinite or > 0), into out[row * 36 + category]. One pass over the tokens instead of
 * numpy's state, code, repeat and bincount passes; `lp` holds float32 or float64 values. */
static PyObject *token_counts(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[6];
    if (!PyArg_ParseTuple(args, "OOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5]))
        return NULL;
    static const char *names[6] = {"n_tok", "source", "mask", "lp", "lp_present", "out"};
    static const Py_ssize_t sizes[6] = {8, 1, 1, 0, 1, 8};
    Py_buffer b[6];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 6; got++)
        if (get_buffer(o[got], &b[got], got == 5 ? PyBUF_WRITABLE | PyBUF_FORMAT : PyBUF_FORMAT, sizes[got],
                       names[got]) < 0)
            goto done;
    Py_ssize_t rows = b[0].len / 8, total = b[1].len, lpsize = b[3].itemsize;
    const int64_t *n_tok = b[0].buf;
    Py_ssize_t sum = 0;
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (n_tok[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "n_tok: negative count");
            goto done;
        }
        sum += n_tok[i];
    }
    if (sum != total || b[2].len != total || b[3].len != total * lpsize || b[4].len != total ||
        b[5].len != rows * 36 * 8 || (lpsize != 4 && lpsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "token_counts: arrays of different lengths, or lp not float32/float64");
        goto done;
    }
    const uint8_t *src = b[1].buf, *mask = b[2].buf, *present = b[4].buf;
    const float *lp32 = b[3].buf;
    const double *lp64 = b[3].buf;
    int64_t *out = b[5].buf;
    Py_BEGIN_ALLOW_THREADS;
    memset(out, 0, (size_t)rows * 36 * 8);
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < rows; i++) {
        int64_t *row = out + 36 * i;
        for (Py_ssize_t end = j + n_tok[i]; j < end; j++) {
            double v = lpsize == 4 ? (double)lp32[j] : lp64[j];
            int state = present[j] ? ((v <= 0.0 && v > -HUGE_VAL) ? 1 : 2) : 0;
            int s = src[j] > 5 ? 5 : src[j];
            row[s * 6 + (mask[j] ? 3 : 0) + state]++;
        }
    }
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    while (got-- > 0)
        PyBuffer_Release(&b[got]);
    return result;
}

static PyObject *sha_extensions(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyBool_FromLong(compress != compress_c);
}

static PyMethodDef methods[] = {
    {"prefix_sha256", prefix_sha256, METH_VARARGS,
     "prefix_sha256(data, lo, hi, first, out): SHA-256 of consecutive prefixes, GIL released."},
    {"token_counts", token_counts, METH_VARARGS,
     "token_counts(n_tok, source, mask, lp, lp_present, out): per-row token counts by category, GIL released."},
    {"sha_extensions", sha_extensions, METH_NOARGS, "Whether the CPU's SHA instructions are used."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The audit's native core.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
#ifdef HAVE_X86
    if (cpu_has_sha() && !getenv("ROLLOUT_AUDIT_NO_SHA_EXTENSIONS"))
        compress = compress_shani;
#endif
    return PyModule_Create(&module);
}
