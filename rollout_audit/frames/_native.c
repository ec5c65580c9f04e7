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

/* Numpy's pairwise summation of doubles (what np.add.reduce and reduceat run for a contiguous
 * float64 segment): below 8 values a running sum from -0.0, up to 128 eight accumulators combined
 * as a tree then the rest, above that the two halves (split at a multiple of 8) summed apart. The
 * same order gives the same bits, so per-turn sums equal the numpy path's exactly. */
static double pairwise_sum(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double res = -0.0;
        for (Py_ssize_t i = 0; i < n; i++)
            res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        Py_ssize_t i;
        for (int k = 0; k < 8; k++)
            r[k] = a[k];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int k = 0; k < 8; k++)
                r[k] += a[i + k];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++)
            res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* What np.add.reduceat gives for one non-empty segment: its first value plus the pairwise sum of
 * the others. */
static double segment_sum(const double *a, Py_ssize_t n) {
    return n > 1 ? a[0] + pairwise_sum(a + 1, n - 1) : a[0];
}

/* Buffers of a call, released in reverse order on every path. */
typedef struct {
    Py_buffer b[16];
    int got;
} buffers;

/* Releases the call's buffers; None when it succeeded, NULL (the error set) otherwise. */
static PyObject *finish(buffers *bs, int ok) {
    while (bs->got > 0)
        PyBuffer_Release(&bs->b[--bs->got]);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* The next argument as a C-contiguous buffer of `itemsize`-byte items (0: 4 or 8, a float array)
 * with `n` items (-1: any), writable when `out`. */
static Py_buffer *arg(buffers *bs, PyObject *o, Py_ssize_t itemsize, Py_ssize_t n, int out, const char *name) {
    Py_buffer *v = &bs->b[bs->got];
    if (get_buffer(o, v, PyBUF_FORMAT | (out ? PyBUF_WRITABLE : 0), itemsize, name) < 0)
        return NULL;
    bs->got++;
    if (!itemsize && v->itemsize != 4 && v->itemsize != 8) {
        PyErr_Format(PyExc_TypeError, "%s: float32 or float64 expected", name);
        return NULL;
    }
    if (n >= 0 && v->len != n * v->itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd items expected, got %zd", name, n, v->len / v->itemsize);
        return NULL;
    }
    return v;
}

/* The rows' layout shared by the per-turn passes: per row its token count and the index of its
 * first turn among the batch's n_turns turns, consistent with the token arrays' length. */
static int check_rows(const int64_t *n_tok, const int64_t *t_start, const int64_t *t_count, Py_ssize_t rows,
                      Py_ssize_t total, Py_ssize_t n_turns, Py_ssize_t *max_tok) {
    Py_ssize_t sum = 0, mx = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (n_tok[r] < 0 || t_count[r] < 0 || t_start[r] < 0 || t_count[r] > n_turns || t_start[r] > n_turns - t_count[r]) {
            PyErr_Format(PyExc_ValueError, "row %zd: negative count or turns outside the batch's", r);
            return -1;
        }
        if (n_tok[r] > total - sum) { /* compared before adding: a sum that wraps around cannot add up */
            PyErr_SetString(PyExc_ValueError, "token counts do not add up to the token arrays' length");
            return -1;
        }
        sum += n_tok[r];
        mx = n_tok[r] > mx ? n_tok[r] : mx;
    }
    if (sum != total) {
        PyErr_SetString(PyExc_ValueError, "token counts do not add up to the token arrays' length");
        return -1;
    }
    *max_tok = mx;
    return 0;
}

/* turn_keys(n_tok, turn_start, turn_count, turn, source, mask, key, n_policy, n_trainable):
 * per token its turn's index among the batch's turns (turn_start[row] + token_turn; -1 when
 * token_turn is negative or not below the row's turn count) into `key` (int32 or int64), and
 * per turn how many of its tokens are policy tokens (source 2) and how many are in the loss. */
static PyObject *turn_keys(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[9];
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    Py_buffer *ntok = arg(&bs, o[0], 8, -1, 0, "n_tok");
    if (!ntok)
        goto done;
    Py_ssize_t rows = ntok->len / 8;
    Py_buffer *ts = arg(&bs, o[1], 8, rows, 0, "turn_start"), *tc = ts ? arg(&bs, o[2], 8, rows, 0, "turn_count") : NULL;
    Py_buffer *turn = tc ? arg(&bs, o[3], 4, -1, 0, "turn") : NULL;
    if (!turn)
        goto done;
    Py_ssize_t total = turn->len / 4;
    Py_buffer *src = arg(&bs, o[4], 1, total, 0, "source"), *mask = src ? arg(&bs, o[5], 1, total, 0, "mask") : NULL;
    Py_buffer *key = mask ? arg(&bs, o[6], 0, total, 1, "key") : NULL;
    Py_buffer *npol = key ? arg(&bs, o[7], 8, -1, 1, "n_policy") : NULL;
    if (!npol)
        goto done;
    Py_ssize_t n_turns = npol->len / 8, max_tok;
    Py_buffer *ntr = arg(&bs, o[8], 8, n_turns, 1, "n_trainable");
    if (!ntr || check_rows(ntok->buf, ts->buf, tc->buf, rows, total, n_turns, &max_tok) < 0)
        goto done;
    const int64_t *n_tok = ntok->buf, *t_start = ts->buf, *t_count = tc->buf;
    const int32_t *tt = turn->buf;
    const uint8_t *sp = src->buf, *mp = mask->buf;
    int64_t *np_ = npol->buf, *nt = ntr->buf;
    int wide = key->itemsize == 8;
    int32_t *k32 = key->buf;
    int64_t *k64 = key->buf;
    Py_BEGIN_ALLOW_THREADS;
    memset(np_, 0, (size_t)n_turns * 8);
    memset(nt, 0, (size_t)n_turns * 8);
    /* the counts of the current turn are kept in registers and added when the turn changes:
     * consecutive tokens mostly share a turn, and a store per token would chain through memory */
    Py_ssize_t j = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t base = t_start[r], cur = -1, pol = 0, tr = 0;
        uint32_t count = (uint32_t)t_count[r]; /* as the numpy path compares: both as uint32 */
        for (Py_ssize_t end = j + n_tok[r]; j < end; j++) {
            int64_t k = (uint32_t)tt[j] < count ? base + tt[j] : -1;
            if (wide)
                k64[j] = k;
            else
                k32[j] = (int32_t)k;
            if (k != cur) {
                if (cur >= 0) {
                    np_[cur] += pol;
                    nt[cur] += tr;
                }
                cur = k;
                pol = tr = 0;
            }
            pol += sp[j] == 2;
            tr += mp[j] != 0;
        }
        if (cur >= 0) {
            np_[cur] += pol;
            nt[cur] += tr;
        }
    }
    Py_END_ALLOW_THREADS;
    ok = 1;
done:
    return finish(&bs, ok);
}

/* turn_sums(n_tok, turn_start, turn_count, key, source, lp, lp_present, n_policy, index, start,
 * n_lp_valid, lp_sum, first): with the keys and policy counts of turn_keys, the indices of the
 * policy tokens that belong to a turn grouped by turn in token order (`index`, int64; `start`:
 * where each turn's run begins), and per turn how many of them have a valid log-prob (present,
 * finite, <= 0), the sum of those log-probs in float64 (a token without one counts 0.0; summed
 * as np.add.reduceat sums the run), and the position in its row of the turn's first policy token
 * (-1 when it has none). */
static PyObject *turn_sums(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[13];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                          &o[9], &o[10], &o[11], &o[12]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    double *vbuf = NULL;
    Py_buffer *ntok = arg(&bs, o[0], 8, -1, 0, "n_tok");
    if (!ntok)
        goto done;
    Py_ssize_t rows = ntok->len / 8;
    Py_buffer *ts = arg(&bs, o[1], 8, rows, 0, "turn_start"), *tc = ts ? arg(&bs, o[2], 8, rows, 0, "turn_count") : NULL;
    Py_buffer *key = tc ? arg(&bs, o[3], 0, -1, 0, "key") : NULL;
    if (!key)
        goto done;
    Py_ssize_t total = key->len / key->itemsize;
    Py_buffer *src = arg(&bs, o[4], 1, total, 0, "source"), *lp = src ? arg(&bs, o[5], 0, total, 0, "lp") : NULL;
    Py_buffer *pres = lp ? arg(&bs, o[6], 1, total, 0, "lp_present") : NULL;
    Py_buffer *npol = pres ? arg(&bs, o[7], 8, -1, 0, "n_policy") : NULL;
    if (!npol)
        goto done;
    Py_ssize_t n_turns = npol->len / 8, max_tok;
    Py_buffer *idx = arg(&bs, o[8], 8, -1, 1, "index");
    Py_buffer *st = idx ? arg(&bs, o[9], 8, n_turns, 1, "start") : NULL;
    Py_buffer *nv = st ? arg(&bs, o[10], 8, n_turns, 1, "n_lp_valid") : NULL;
    Py_buffer *sum = nv ? arg(&bs, o[11], 8, n_turns, 1, "lp_sum") : NULL;
    Py_buffer *first = sum ? arg(&bs, o[12], 8, n_turns, 1, "first") : NULL;
    if (!first || check_rows(ntok->buf, ts->buf, tc->buf, rows, total, n_turns, &max_tok) < 0)
        goto done;
    const int64_t *n_tok = ntok->buf, *t_start = ts->buf, *t_count = tc->buf, *np_ = npol->buf;
    Py_ssize_t m = 0;
    for (Py_ssize_t k = 0; k < n_turns && m >= 0; k++) /* a negative count, or one past index, never adds up */
        m = np_[k] < 0 || np_[k] > idx->len / 8 - m ? -1 : m + np_[k];
    if (m < 0 || idx->len != m * 8) {
        PyErr_SetString(PyExc_ValueError, "index: as many entries as policy tokens in turns expected");
        goto done;
    }
    const int32_t *k32 = key->buf;
    const int64_t *k64 = key->buf;
    int wide = key->itemsize == 8;
    /* the values of one row's policy tokens in turns, grouped as `index` */
    int64_t row_cap = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t c = 0;
        for (int64_t k = t_start[r]; k < t_start[r] + t_count[r]; k++)
            c += np_[k];
        row_cap = c > row_cap ? c : row_cap;
    }
    vbuf = PyMem_RawMalloc(((size_t)row_cap + 1) * sizeof(double));
    if (!vbuf) {
        PyErr_NoMemory();
        goto done;
    }
    const uint8_t *sp = src->buf, *pp = pres->buf;
    const float *lp32 = lp->buf;
    const double *lp64 = lp->buf;
    int single = lp->itemsize == 4;
    int64_t *ix = idx->buf, *sv = st->buf, *nvp = nv->buf, *fp = first->buf;
    double *sp_sum = sum->buf;
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS;
    int64_t at = 0;
    for (Py_ssize_t k = 0; k < n_turns; k++) {
        sv[k] = at;
        at += np_[k];
        nvp[k] = 0;
        sp_sum[k] = 0.0;
        fp[k] = -1;
    }
    Py_ssize_t j = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        Py_ssize_t row0 = j, end = j + n_tok[r];
        int64_t k0 = t_start[r], nk = t_count[r];
        if (!nk) {
            j = end;
            continue;
        }
        int64_t base = sv[k0];  /* the row's policy tokens in turns occupy index[base:...] */
        /* `first` holds each turn's fill cursor meanwhile (relative to base) */
        for (int64_t k = k0; k < k0 + nk; k++)
            fp[k] = sv[k] - base;
        /* the current turn's fill cursor and valid count stay in registers until the turn changes */
        int64_t cur = -1, p = 0, lim = 0, nvalid = 0;
        for (; j < end; j++) {
            int64_t k = wide ? k64[j] : k32[j];
            if (k < 0 || sp[j] != 2)
                continue;
            if (k != cur) {
                if (k < k0 || k >= k0 + nk) { /* not a key of this row's turns: refused below */
                    bad = j;
                    break;
                }
                if (cur >= 0) {
                    fp[cur] = p;
                    nvp[cur] += nvalid;
                }
                cur = k;
                p = fp[k];
                lim = sv[k] - base + np_[k];
                nvalid = 0;
            }
            if (p >= lim) { /* more policy tokens than turn_keys counted */
                bad = j;
                break;
            }
            double v = single ? (double)lp32[j] : lp64[j];
            int valid = pp[j] && v <= 0.0 && v > -HUGE_VAL;
            ix[base + p] = j;
            vbuf[p++] = valid ? v : 0.0;
            nvalid += valid;
        }
        if (bad >= 0)
            break;
        if (cur >= 0) {
            fp[cur] = p;
            nvp[cur] += nvalid;
        }
        /* every cursor must have reached its turn's end: the policy counts were this pass's */
        for (int64_t k = k0; k < k0 + nk; k++)
            if (fp[k] != sv[k] - base + np_[k])
                bad = row0;
        if (bad >= 0)
            break;
        for (int64_t k = k0; k < k0 + nk; k++) {
            int64_t c = np_[k], p = sv[k] - base;
            if (c) {
                sp_sum[k] = segment_sum(vbuf + p, c);
                fp[k] = ix[sv[k]] - row0;
            } else
                fp[k] = -1;
        }
    }
    Py_END_ALLOW_THREADS;
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "turn_sums: keys or policy counts not those of turn_keys (token %zd)", bad);
        goto done;
    }
    ok = 1;
done:
    PyMem_RawFree(vbuf);
    return finish(&bs, ok);
}

/* to_go(v, row, out): per element, the sum of v over it and every later element of its row
 * (`row`, int32 or int64, sorted), computed as the numpy path does: a running sum over the whole
 * array (np.cumsum's order), then out[i] = (c[last of its row] - c[i]) + v[i]. */
static PyObject *to_go(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    Py_buffer *v = arg(&bs, o[0], 8, -1, 0, "v");
    if (!v)
        goto done;
    Py_ssize_t n = v->len / 8;
    Py_buffer *row = arg(&bs, o[1], 0, n, 0, "row"), *out = row ? arg(&bs, o[2], 8, n, 1, "out") : NULL;
    if (!out)
        goto done;
    const double *vp = v->buf;
    double *op = out->buf;
    const int32_t *r32 = row->buf;
    const int64_t *r64 = row->buf;
    int wide = row->itemsize == 8;
    Py_BEGIN_ALLOW_THREADS;
    double c = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        c = i ? c + vp[i] : vp[i];
        op[i] = c;
    }
    for (Py_ssize_t i = 0; i < n;) {
        int64_t rid = wide ? r64[i] : r32[i];
        Py_ssize_t e = i;
        while (e + 1 < n && (wide ? r64[e + 1] : r32[e + 1]) == rid)
            e++;
        double last = op[e];
        for (; i <= e; i++)
            op[i] = (last - op[i]) + vp[i];
    }
    Py_END_ALLOW_THREADS;
    ok = 1;
done:
    return finish(&bs, ok);
}

/* The value of a float32 or float64 buffer at i, in double. */
static inline double fget(const Py_buffer *b, Py_ssize_t i) {
    return b->itemsize == 4 ? (double)((const float *)b->buf)[i] : ((const double *)b->buf)[i];
}

/* terms(at, rew, rew_present, kl, kl_present, out): R413's per-token terms at the tokens `at`
 * (int64): rew[at] - kl[at] in float64, a value not present counting 0.0 (an empty `*_present`:
 * every one is; an empty `kl`: no KL term). */
static PyObject *terms(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[6];
    if (!PyArg_ParseTuple(args, "OOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    Py_buffer *at = arg(&bs, o[0], 8, -1, 0, "at"), *rew = at ? arg(&bs, o[1], 0, -1, 0, "rew") : NULL;
    if (!rew)
        goto done;
    Py_ssize_t n = at->len / 8, total = rew->len / rew->itemsize;
    Py_buffer *rp = arg(&bs, o[2], 1, -1, 0, "rew_present"), *kl = rp ? arg(&bs, o[3], 0, -1, 0, "kl") : NULL;
    Py_buffer *kp = kl ? arg(&bs, o[4], 1, -1, 0, "kl_present") : NULL;
    Py_buffer *out = kp ? arg(&bs, o[5], 8, n, 1, "out") : NULL;
    if (!out)
        goto done;
    if ((rp->len && rp->len != total) || (kl->len && kl->len != total * kl->itemsize) || (kp->len && kp->len != total)) {
        PyErr_SetString(PyExc_ValueError, "terms: rew, kl and their present flags must cover the same tokens");
        goto done;
    }
    const int64_t *ap = at->buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (ap[i] < 0 || ap[i] >= total) {
            PyErr_Format(PyExc_ValueError, "terms: token %lld is not among %zd", (long long)ap[i], total);
            goto done;
        }
    const uint8_t *rpp = rp->buf, *kpp = kp->buf;
    int has_kl = kl->len > 0;
    double *op = out->buf;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = ap[i];
        double r = rp->len && !rpp[j] ? 0.0 : fget(rew, j);
        op[i] = has_kl ? r - (kp->len && !kpp[j] ? 0.0 : fget(kl, j)) : r;
    }
    Py_END_ALLOW_THREADS;
    ok = 1;
done:
    return finish(&bs, ok);
}

/* placement(n_tok, source, turn, v, present, wrong, n_placed): R411's per-token condition: a
 * token whose value is placed (present and not 0; NaN is placed) and that is not the last policy
 * token of its turn (the next policy token of its row has another token_turn, or there is none)
 * -> wrong; and per row how many are placed. */
static PyObject *placement(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[7];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    Py_buffer *ntok = arg(&bs, o[0], 8, -1, 0, "n_tok"), *src = ntok ? arg(&bs, o[1], 1, -1, 0, "source") : NULL;
    if (!src)
        goto done;
    Py_ssize_t rows = ntok->len / 8, total = src->len;
    Py_buffer *turn = arg(&bs, o[2], 4, total, 0, "turn"), *v = turn ? arg(&bs, o[3], 0, total, 0, "v") : NULL;
    Py_buffer *pres = v ? arg(&bs, o[4], 1, total, 0, "present") : NULL;
    Py_buffer *wrong = pres ? arg(&bs, o[5], 1, total, 1, "wrong") : NULL;
    Py_buffer *np_ = wrong ? arg(&bs, o[6], 8, rows, 1, "n_placed") : NULL;
    if (!np_)
        goto done;
    const int64_t *n_tok = ntok->buf;
    Py_ssize_t sum = 0;
    for (Py_ssize_t r = 0; r < rows && sum <= total; r++) /* a negative count, or one past the tokens, never adds up */
        sum = n_tok[r] < 0 || n_tok[r] > total - sum ? total + 1 : sum + n_tok[r];
    if (sum != total) {
        PyErr_SetString(PyExc_ValueError, "placement: token counts do not add up to the token arrays' length");
        goto done;
    }
    const uint8_t *sp = src->buf, *pp = pres->buf;
    const int32_t *tt = turn->buf;
    uint8_t *wp = wrong->buf;
    int64_t *npp = np_->buf;
    Py_BEGIN_ALLOW_THREADS;
    Py_ssize_t j = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        Py_ssize_t prev = -1; /* the row's previous policy token: last of its turn unless the next one shares it */
        int64_t placed = 0;
        for (Py_ssize_t end = j + n_tok[r]; j < end; j++) {
            double x = fget(v, j);
            uint8_t put = pp[j] && !(x == 0.0);
            placed += put;
            wp[j] = put;
            if (sp[j] == 2) {
                if (prev >= 0 && tt[j] != tt[prev])
                    wp[prev] = 0; /* prev ends its turn: a value there is in place */
                prev = j;
            }
        }
        if (prev >= 0)
            wp[prev] = 0; /* the row's last policy token ends its turn */
        npp[r] = placed;
    }
    Py_END_ALLOW_THREADS;
    ok = 1;
done:
    return finish(&bs, ok);
}

/* outside(held, length, ids, miss): L210's membership test in one pass over the kept ids: per
 * token i (int32 `held`), miss[i] = 1 when it records a nucleus (length[i] > 0, int64) and none of
 * its length[i] ids (the next ones in `ids`, int32 or int64, back to back in token order) equals
 * it; 0 otherwise. */
static PyObject *outside(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[4];
    if (!PyArg_ParseTuple(args, "OOOO", &o[0], &o[1], &o[2], &o[3]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    Py_buffer *held = arg(&bs, o[0], 4, -1, 0, "held");
    Py_ssize_t n = held ? held->len / 4 : 0;
    Py_buffer *len = held ? arg(&bs, o[1], 8, n, 0, "length") : NULL;
    Py_buffer *ids = len ? arg(&bs, o[2], 0, -1, 0, "ids") : NULL;
    Py_buffer *miss = ids ? arg(&bs, o[3], 1, n, 1, "miss") : NULL;
    if (!miss)
        goto done;
    const int32_t *hp = held->buf;
    const int64_t *lp = len->buf;
    Py_ssize_t k = ids->len / ids->itemsize, sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (lp[i] < 0 || lp[i] > k - sum) {
            PyErr_SetString(PyExc_ValueError, "outside: the span lengths do not add up to the ids' length");
            goto done;
        }
        sum += lp[i];
    }
    if (sum != k) {
        PyErr_SetString(PyExc_ValueError, "outside: the span lengths do not add up to the ids' length");
        goto done;
    }
    uint8_t *mp = miss->buf;
    int wide = ids->itemsize == 8;
    Py_BEGIN_ALLOW_THREADS;
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t want = hp[i];
        uint8_t found = 0;
        Py_ssize_t end = j + lp[i];
        if (wide) {
            const int64_t *ip = ids->buf;
            for (; j < end && !found; j++)
                found = ip[j] == want;
        } else {
            const int32_t *ip = ids->buf;
            for (; j < end && !found; j++)
                found = ip[j] == want;
        }
        j = end;
        mp[i] = lp[i] > 0 && !found;
    }
    Py_END_ALLOW_THREADS;
    ok = 1;
done:
    return finish(&bs, ok);
}

static PyObject *sha_extensions(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyBool_FromLong(compress != compress_c);
}

/* Defined in the block at the end of the file (turn tags and hex digests). */
static PyObject *turn_tags(PyObject *self, PyObject *args);
static PyObject *hex_differs(PyObject *self, PyObject *args);
/* The rows of a batch as token counts (int64, `rows` of them) that add up to `total`, each count
 * compared with what is left before it is added (a sum that wraps around cannot add up). */
static int counts_add_up(const int64_t *n_tok, Py_ssize_t rows, Py_ssize_t total, const char *who) {
    Py_ssize_t sum = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (n_tok[r] < 0 || n_tok[r] > total - sum) {
            sum = -1;
            break;
        }
        sum += n_tok[r];
    }
    if (sum != total) {
        PyErr_Format(PyExc_ValueError, "%s: token counts do not add up to the token arrays' length", who);
        return -1;
    }
    return 0;
}

/* One row's tokens [j, end) counted by category (source * 2 + trainable) * 3 + log-prob state into
 * h (the float compared only where a log-prob is present: most tokens have none). */
static inline __attribute__((always_inline)) void count_row(int64_t h[36], const uint8_t *src, const uint8_t *mask,
                                                            const void *lp, int wide, const uint8_t *present,
                                                            Py_ssize_t j, Py_ssize_t end) {
    for (; j < end; j++) {
        int state = 0;
        if (present[j]) {
            double v = wide ? ((const double *)lp)[j] : (double)((const float *)lp)[j];
            state = v <= 0.0 && v > -HUGE_VAL ? 1 : 2;
        }
        int s = src[j] > 5 ? 5 : src[j];
        h[s * 6 + (mask[j] ? 3 : 0) + state]++;
    }
}

/* token_stats(n_tok, source, mask, lp, lp_present, weights, out): per row, its tokens counted by
 * category (source 0..5, any other value 5; trainable 0 or 1; log-prob state 0
 * none, 1 finite and <= 0, 2 NaN, infinite or > 0), and from those counts each of k statistics:
 * out[s * rows + row] = the sum of the counts of the categories c with weights[c * k + s] = 1
 * (`weights` uint8, 36 x k, every entry 0 or 1; `lp` float32 or float64). */
static PyObject *token_stats(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[7];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    Py_buffer *ntok = arg(&bs, o[0], 8, -1, 0, "n_tok"), *src = ntok ? arg(&bs, o[1], 1, -1, 0, "source") : NULL;
    if (!src)
        goto done;
    Py_ssize_t rows = ntok->len / 8, total = src->len;
    Py_buffer *mask = arg(&bs, o[2], 1, total, 0, "mask"), *lp = mask ? arg(&bs, o[3], 0, total, 0, "lp") : NULL;
    Py_buffer *pres = lp ? arg(&bs, o[4], 1, total, 0, "lp_present") : NULL;
    Py_buffer *w = pres ? arg(&bs, o[5], 1, -1, 0, "weights") : NULL;
    if (!w)
        goto done;
    Py_ssize_t k = w->len / 36;
    Py_buffer *out = arg(&bs, o[6], 8, k * rows, 1, "out");
    if (!out || counts_add_up(ntok->buf, rows, total, "token_stats") < 0)
        goto done;
    const uint8_t *wp = w->buf;
    if (w->len != 36 * k) {
        PyErr_SetString(PyExc_ValueError, "token_stats: weights must hold 36 rows of k entries");
        goto done;
    }
    for (Py_ssize_t i = 0; i < w->len; i++)
        if (wp[i] > 1) {
            PyErr_SetString(PyExc_ValueError, "token_stats: every weight must be 0 or 1");
            goto done;
        }
    const int64_t *n_tok = ntok->buf;
    const uint8_t *sp = src->buf, *mp = mask->buf, *pp = pres->buf;
    int64_t *op = out->buf;
    int wide = lp->itemsize == 8;
    Py_BEGIN_ALLOW_THREADS;
    Py_ssize_t j = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t h[36];
        memset(h, 0, sizeof h);
        Py_ssize_t end = j + n_tok[r];
        if (wide)
            count_row(h, sp, mp, lp->buf, 1, pp, j, end);
        else
            count_row(h, sp, mp, lp->buf, 0, pp, j, end);
        j = end;
        for (Py_ssize_t s = 0; s < k; s++)
            op[s * rows + r] = 0;
        for (int c = 0; c < 36; c++) {
            int64_t n = h[c];
            if (!n)
                continue;
            for (Py_ssize_t s = 0; s < k; s++)
                if (wp[c * k + s])
                    op[s * rows + r] += n;
        }
    }
    Py_END_ALLOW_THREADS;
    ok = 1;
done:
    return finish(&bs, ok);
}

/* A route of `routes64` in float64, as a cast of the int64 routes gives it; NaN where not present. */
static inline double route_at(const int64_t *v, const uint8_t *present, int complete, Py_ssize_t j) {
    return complete || present[j] ? (double)v[j] : NAN;
}

/* routes64(n_tok, key, source, v, present, fits, pv, lo, hi, lost, wrong, other): P505's three
 * per-token conditions over a batch's routes `v` as stored (int64, read only where `present`: an
 * empty `present` means every token has one), each compared as its float64 value: `lost`, a token
 * of a row whose list fits without a value, before its row's last policy token (no log-prob reads
 * the routes from there on); `wrong`, a policy token (source 2) of a turn (key >= 0), not its
 * row's first, whose log-prob is read through the routes at the position before it, when those
 * differ from its turn's version pv[key] (a turn without a version, NaN, or no value at that
 * position is not compared); `other`, a token the policy did not sample whose value lies outside
 * its row's [lo, hi] (no value is not outside). */
static PyObject *routes64(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[12];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                          &o[9], &o[10], &o[11]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    Py_buffer *ntok = arg(&bs, o[0], 8, -1, 0, "n_tok"), *key = ntok ? arg(&bs, o[1], 0, -1, 0, "key") : NULL;
    if (!key)
        goto done;
    Py_ssize_t rows = ntok->len / 8, total = key->len / key->itemsize;
    Py_buffer *src = arg(&bs, o[2], 1, total, 0, "source"), *v = src ? arg(&bs, o[3], 8, total, 0, "v") : NULL;
    Py_buffer *pres = v ? arg(&bs, o[4], 1, -1, 0, "present") : NULL;
    Py_buffer *fits = pres ? arg(&bs, o[5], 1, rows, 0, "fits") : NULL;
    Py_buffer *pv = fits ? arg(&bs, o[6], 8, -1, 0, "pv") : NULL;
    Py_buffer *lo = pv ? arg(&bs, o[7], 8, rows, 0, "lo") : NULL, *hi = lo ? arg(&bs, o[8], 8, rows, 0, "hi") : NULL;
    Py_buffer *lost = hi ? arg(&bs, o[9], 1, total, 1, "lost") : NULL;
    Py_buffer *wrong = lost ? arg(&bs, o[10], 1, total, 1, "wrong") : NULL;
    Py_buffer *other = wrong ? arg(&bs, o[11], 1, total, 1, "other") : NULL;
    if (!other || counts_add_up(ntok->buf, rows, total, "routes64") < 0)
        goto done;
    if (pres->len && pres->len != total) {
        PyErr_SetString(PyExc_ValueError, "routes64: present must cover the tokens");
        goto done;
    }
    const int64_t *n_tok = ntok->buf, *vp = v->buf, *k64 = key->buf;
    const int32_t *k32 = key->buf;
    Py_ssize_t n_turns = pv->len / 8;
    int wide = key->itemsize == 8, complete = pres->len == 0;
    const uint8_t *sp = src->buf, *pp = pres->buf, *fp = fits->buf;
    const double *pvp = pv->buf, *lop = lo->buf, *hip = hi->buf;
    uint8_t *lp_ = lost->buf, *wp = wrong->buf, *op = other->buf;
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS;
    Py_ssize_t j = 0;
    for (Py_ssize_t r = 0; r < rows && bad < 0; r++) {
        double rlo = lop[r], rhi = hip[r];
        uint8_t rfits = fp[r] != 0;
        Py_ssize_t row0 = j, end = j + n_tok[r], last = end - 1;
        while (last >= row0 && sp[last] != 2) /* the row's last policy token: no route is read from it on */
            last--;
        for (; j < end; j++) {
            lp_[j] = complete || j >= last ? 0 : rfits & !pp[j];
            if (sp[j] != 2) {
                double x = route_at(vp, pp, complete, j);
                wp[j] = 0;
                op[j] = x < rlo || x > rhi;
                continue;
            }
            op[j] = 0;
            int64_t k = wide ? k64[j] : k32[j];
            if (k < 0 || j == row0) {
                wp[j] = 0;
                continue;
            }
            if (k >= n_turns) {
                bad = j;
                break;
            }
            double tv = pvp[k];
            wp[j] = (complete || pp[j - 1]) && !isnan(tv) && !((double)vp[j - 1] == tv);
        }
    }
    Py_END_ALLOW_THREADS;
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "routes64: the key of token %zd names no turn", bad);
        goto done;
    }
    ok = 1;
done:
    return finish(&bs, ok);
}

/* One token's M110 bits (see streams8) from its stream value (uint8; `has_st`: the column is there,
 * `st_here`: this token has a value) and its weight (`has_w`, `w_here`, the value `x`). */
static inline uint8_t stream_bits(uint8_t m, uint8_t src, int st_here, uint8_t stream, int w_here, double x) {
    uint8_t bits = 0;
    if (m && st_here) {
        if (stream == 1 && src != 1 && src != 3)
            bits |= 1;
        else if (stream > 1)
            bits |= 2;
    }
    if (w_here) {
        if (!(x >= 0.0) || x == HUGE_VAL)
            bits |= 4;
        else if ((x > 0.0) != m)
            bits |= m ? 16 : 8;
    }
    return bits;
}

/* streams8(mask, source, stream, stream_present, weight, weight_present, out) -> int: M110's
 * per-token conditions in one pass, as bits of `out` (uint8): 1, a token in the loss whose stream
 * (uint8 as stored, 0 where not present) is the echo stream 1 and whose source is neither user (1)
 * nor observation (3); 2, a token in the loss whose stream is above 1; 4, a present weight that is
 * negative, NaN or +inf; 8, a present weight that is not invalid and is > 0 outside the loss; 16,
 * one that is not > 0 in the loss. An empty `stream` or `weight` (float32 or float64): that column
 * is absent; an empty `*_present`: every token has a value. Returns the OR of every token's bits. */
static PyObject *streams8(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[7];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    long seen = 0;
    Py_buffer *mask = arg(&bs, o[0], 1, -1, 0, "mask"), *src = mask ? arg(&bs, o[1], 1, mask->len, 0, "source") : NULL;
    if (!src)
        goto done;
    Py_ssize_t total = mask->len;
    Py_buffer *st = arg(&bs, o[2], 1, -1, 0, "stream"), *sp = st ? arg(&bs, o[3], 1, -1, 0, "stream_present") : NULL;
    Py_buffer *w = sp ? arg(&bs, o[4], 0, -1, 0, "weight") : NULL;
    Py_buffer *wp = w ? arg(&bs, o[5], 1, -1, 0, "weight_present") : NULL;
    Py_buffer *out = wp ? arg(&bs, o[6], 1, total, 1, "out") : NULL;
    if (!out)
        goto done;
    int has_st = st->len > 0, has_w = w->len > 0;
    if ((has_st && st->len != total) || (sp->len && (!has_st || sp->len != total)) ||
        (has_w && w->len != total * w->itemsize) || (wp->len && (!has_w || wp->len != total))) {
        PyErr_SetString(PyExc_ValueError, "streams8: every array must cover the same tokens");
        goto done;
    }
    const uint8_t *mp = mask->buf, *srp = src->buf, *stp = st->buf, *spp = sp->buf, *wpp = wp->buf;
    const float *w32 = w->buf;
    const double *w64 = w->buf;
    int wide = w->itemsize == 8, st_all = !sp->len, w_all = !wp->len;
    uint8_t *op = out->buf, any = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < total; i++) {
        int st_here = has_st && (st_all || spp[i]), w_here = has_w && (w_all || wpp[i]);
        double x = !w_here ? 0.0 : wide ? w64[i] : (double)w32[i];
        uint8_t bits = stream_bits(mp[i] != 0, srp[i], st_here, st_here ? stp[i] : 0, w_here, x);
        op[i] = bits;
        any |= bits;
    }
    Py_END_ALLOW_THREADS;
    seen = any;
    ok = 1;
done:
    if (!finish(&bs, ok))
        return NULL;
    Py_DECREF(Py_None); /* finish returned a new reference to None */
    return PyLong_FromLong(seen);
}

static PyMethodDef methods[] = {
    {"prefix_sha256", prefix_sha256, METH_VARARGS,
     "prefix_sha256(data, lo, hi, first, out): SHA-256 of consecutive prefixes, GIL released."},
    {"turn_keys", turn_keys, METH_VARARGS,
     "turn_keys(n_tok, turn_start, turn_count, turn, source, mask, key, n_policy, n_trainable): turn keys and "
     "per-turn counts, GIL released."},
    {"turn_sums", turn_sums, METH_VARARGS,
     "turn_sums(n_tok, turn_start, turn_count, key, source, lp, lp_present, n_policy, index, start, n_lp_valid, "
     "lp_sum, first): policy tokens grouped by turn and per-turn log-prob sums, GIL released."},
    {"to_go", to_go, METH_VARARGS, "to_go(v, row, out): reward-to-go within each row, GIL released."},
    {"terms", terms, METH_VARARGS, "terms(at, rew, rew_present, kl, kl_present, out): R413's terms, GIL released."},
    {"placement", placement, METH_VARARGS,
     "placement(n_tok, source, turn, v, present, wrong, n_placed): R411's misplaced values, GIL released."},
    {"outside", outside, METH_VARARGS,
     "outside(held, length, ids, miss): L210's tokens outside their recorded nucleus, GIL released."},
    {"sha_extensions", sha_extensions, METH_NOARGS, "Whether the CPU's SHA instructions are used."},
    {"turn_tags", turn_tags, METH_VARARGS,
     "turn_tags(n_tok, turn, key, late_n, late_first, wrong_n, wrong_first): S004's token_turn tags per row, "
     "GIL released."},
    {"hex_differs", hex_differs, METH_VARARGS,
     "hex_differs(offsets, data, valid, at, digests, out): recorded hex digests against SHA-256 digests, GIL "
     "released."},
    {"token_stats", token_stats, METH_VARARGS,
     "token_stats(n_tok, source, mask, lp, lp_present, weights, out): per-row token statistics from the counts "
     "by category, GIL released."},
    {"routes64", routes64, METH_VARARGS,
     "routes64(n_tok, key, source, v, present, fits, pv, lo, hi, lost, wrong, other): P505's per-token "
     "conditions over int64 routes, GIL released."},
    {"streams8", streams8, METH_VARARGS,
     "streams8(mask, source, stream, stream_present, weight, weight_present, out): M110's per-token conditions "
     "over uint8 streams as bits, GIL released; returns the OR of the bits."},
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

/* ------------------------------------------------------------------------------------------------
 * S004's token_turn tags and M105/M107's recorded digests: one pass each instead of numpy's casts,
 * running maximum and byte matrices. */

/* turn_tags(n_tok, turn, key, late_n, late_first, wrong_n, wrong_first): per row of `n_tok`
 * consecutive tokens (int32 `turn`, its token_turn; int32 or int64 `key`, its turn key, -1 when it
 * names no turn of the row), how many tokens carry token_turn -1 after a token of the row with a
 * token_turn >= 0 (late), and how many have a negative key with a token_turn other than -1
 * (wrong), with the position in the row of the first of each (-1: none). All outputs int64. */
static PyObject *turn_tags(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[7];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    Py_buffer *ntok = arg(&bs, o[0], 8, -1, 0, "n_tok"), *turn = ntok ? arg(&bs, o[1], 4, -1, 0, "turn") : NULL;
    if (!turn)
        goto done;
    Py_ssize_t rows = ntok->len / 8, total = turn->len / 4;
    Py_buffer *key = arg(&bs, o[2], 0, total, 0, "key");
    Py_buffer *ln = key ? arg(&bs, o[3], 8, rows, 1, "late_n") : NULL;
    Py_buffer *lf = ln ? arg(&bs, o[4], 8, rows, 1, "late_first") : NULL;
    Py_buffer *wn = lf ? arg(&bs, o[5], 8, rows, 1, "wrong_n") : NULL;
    Py_buffer *wf = wn ? arg(&bs, o[6], 8, rows, 1, "wrong_first") : NULL;
    if (!wf)
        goto done;
    const int64_t *n_tok = ntok->buf;
    if (counts_add_up(n_tok, rows, total, "turn_tags") < 0)
        goto done;
    const int32_t *tt = turn->buf, *k32 = key->buf;
    const int64_t *k64 = key->buf;
    int wide = key->itemsize == 8;
    int64_t *lnp = ln->buf, *lfp = lf->buf, *wnp = wn->buf, *wfp = wf->buf;
    Py_BEGIN_ALLOW_THREADS;
    Py_ssize_t j = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t late = 0, wrong = 0, first_late = -1, first_wrong = -1;
        int seen = 0; /* a token of the row so far names a turn (token_turn >= 0) */
        for (Py_ssize_t row0 = j, end = j + n_tok[r]; j < end; j++) {
            int32_t t = tt[j];
            if (t == -1) {
                if (seen && !late++)
                    first_late = j - row0;
                continue;
            }
            seen |= t >= 0;
            if ((wide ? k64[j] : (int64_t)k32[j]) < 0 && !wrong++)
                first_wrong = j - row0;
        }
        lnp[r] = late;
        lfp[r] = first_late;
        wnp[r] = wrong;
        wfp[r] = first_wrong;
    }
    Py_END_ALLOW_THREADS;
    ok = 1;
done:
    return finish(&bs, ok);
}

/* hex_differs(offsets, data, valid, at, digests, out): per entry i of `at` (int64 indices into a
 * string array of n strings: `offsets`, its n + 1 int32 or int64 boundaries into `data`; `valid`,
 * uint8 per string, empty when every one is), out[i] = 0 when string at[i] is valid and is the
 * 64 hex digits of the 32 bytes digests[32 i : 32 i + 32] in any case (ASCII A-Z read as a-z),
 * 1 otherwise. */
static PyObject *hex_differs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[6];
    if (!PyArg_ParseTuple(args, "OOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5]))
        return NULL;
    buffers bs = {.got = 0};
    int ok = 0;
    Py_buffer *off = arg(&bs, o[0], 0, -1, 0, "offsets"), *data = off ? arg(&bs, o[1], 1, -1, 0, "data") : NULL;
    Py_buffer *valid = data ? arg(&bs, o[2], 1, -1, 0, "valid") : NULL;
    Py_buffer *at = valid ? arg(&bs, o[3], 8, -1, 0, "at") : NULL;
    Py_ssize_t k = at ? at->len / 8 : 0, n = off ? off->len / off->itemsize - 1 : -1;
    Py_buffer *dig = at ? arg(&bs, o[4], 1, 32 * k, 0, "digests") : NULL;
    Py_buffer *out = dig ? arg(&bs, o[5], 1, k, 1, "out") : NULL;
    if (!out)
        goto done;
    if (n < 0 || (valid->len && valid->len != n)) {
        PyErr_SetString(PyExc_ValueError, "hex_differs: offsets and valid do not describe one string array");
        goto done;
    }
    const int32_t *o32 = off->buf;
    const int64_t *o64 = off->buf, *ap = at->buf;
    int wide = off->itemsize == 8;
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t a = ap[i];
        int64_t lo = a >= 0 && a < n ? (wide ? o64[a] : o32[a]) : -1, hi = lo >= 0 ? (wide ? o64[a + 1] : o32[a + 1]) : -1;
        if (lo < 0 || hi < lo || hi > data->len) {
            PyErr_Format(PyExc_ValueError, "hex_differs: entry %zd names no string inside the data", i);
            goto done;
        }
    }
    const uint8_t *dp = data->buf, *vp = valid->buf, *gp = dig->buf;
    uint8_t *op = out->buf;
    static const char hex[] = "0123456789abcdef";
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t a = ap[i], lo = wide ? o64[a] : o32[a], hi = wide ? o64[a + 1] : o32[a + 1];
        uint8_t differ = hi - lo != 64 || (valid->len && !vp[a]);
        const uint8_t *s = dp + lo, *g = gp + 32 * i;
        for (int b = 0; b < 32 && !differ; b++) {
            uint8_t c0 = s[2 * b], c1 = s[2 * b + 1];
            c0 += (c0 >= 'A' && c0 <= 'Z') ? 32 : 0;
            c1 += (c1 >= 'A' && c1 <= 'Z') ? 32 : 0;
            differ = c0 != (uint8_t)hex[g[b] >> 4] || c1 != (uint8_t)hex[g[b] & 15];
        }
        op[i] = differ;
    }
    Py_END_ALLOW_THREADS;
    ok = 1;
done:
    return finish(&bs, ok);
}
