/* Family (8) sampler in C: the same arithmetic as pram_lib.core.perturb's numpy kernel, one pass instead of nine.
 *
 * Uniforms come from the caller's numpy Generator, 256 at a time, exactly as Generator.random(out=) draws
 * them, so for the same generator state the output, and the state left behind, are identical to the numpy
 * kernel's. Two sources:
 *  - any bit generator, through its bitgen_t (numpy/random/bitgen.h; restated here, no numpy headers needed);
 *  - numpy's PCG64, stepped here (pcg64_fill): the same 128-bit LCG and XSL-RR output, four states apart at a
 *    time (state' = a^4 state + c(a^3 + a^2 + a + 1)), so four multiplications are in flight instead of one
 *    per value behind a function pointer. fastpath.py checks the state layout against numpy before use.
 * Built by `python -m pram_lib.core.fastpath` (make install); pram_lib works without it.
 */
#include <stdint.h>

typedef struct bitgen {
    void *state;
    uint64_t (*next_uint64)(void *st);
    uint32_t (*next_uint32)(void *st);
    double (*next_double)(void *st);
    uint64_t (*next_raw)(void *st);
} bitgen_t;

typedef __uint128_t u128;
typedef struct { u128 state, inc; } pcg128_t;                           /* numpy's pcg_state_setseq_128 */
typedef struct { pcg128_t *pcg; int has_uint32; uint32_t uinteger; } pcg64_t;  /* numpy's pcg64_state */
#define PCG_MULT (((u128)2549297995355413924ULL << 64) | 4865540595714422341ULL)

static inline double pcg_double(u128 s) {                               /* XSL-RR, then 53 bits -> [0, 1) */
    uint64_t v = (uint64_t)(s >> 64) ^ (uint64_t)s;
    unsigned r = (unsigned)(s >> 122);
    v = (v >> r) | (v << ((-r) & 63));
    return (double)(v >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct { bitgen_t *bg; pcg128_t *pcg; u128 m4, c4; } source_t;

static void source_init(source_t *src, bitgen_t *bg, int pcg64) {
    src->bg = bg;
    src->pcg = pcg64 ? ((pcg64_t *)bg->state)->pcg : 0;
    if (src->pcg) {
        const u128 a = PCG_MULT, a2 = a * a;
        src->m4 = a2 * a2;
        src->c4 = src->pcg->inc * (a2 * a + a2 + a + 1);
    }
}

static inline void source_fill(source_t *src, double *u, int64_t w) {
    if (!src->pcg) {
        double (*next)(void *) = src->bg->next_double;
        void *st = src->bg->state;
        for (int64_t j = 0; j < w; j++) u[j] = next(st);
        return;
    }
    const u128 a = PCG_MULT, c = src->pcg->inc;
    u128 s = src->pcg->state;
    int64_t j = 0;
    if (w >= 4) {
        u128 s0 = s * a + c, s1 = s0 * a + c, s2 = s1 * a + c, s3 = s2 * a + c;
        for (;;) {
            u[j] = pcg_double(s0); u[j + 1] = pcg_double(s1); u[j + 2] = pcg_double(s2); u[j + 3] = pcg_double(s3);
            j += 4;
            if (j + 4 > w) break;
            s0 = s0 * src->m4 + src->c4; s1 = s1 * src->m4 + src->c4;
            s2 = s2 * src->m4 + src->c4; s3 = s3 * src->m4 + src->c4;
        }
        s = s3;
    }
    for (; j < w; j++) { s = s * a + c; u[j] = pcg_double(s); }
    src->pcg->state = s;
}

/* codes in [-1, s-1] (-1 = missing); qa[2 x1], qa[2 x1 + 1]: threshold and scale of code x1 - 1 (x1 = 0:
 * missing); wrap2[j + 2] = (j + 1) mod s (int32) for j in [-1, 2s-3], wrap2[0] = -1 (missing). Branch-free: the keep
 * decision is the sign of t = (u - q) a (exact: t < 0 iff u < q), a move goes floor(t) + 1 places on. */
#define KEEP_UNIFORM(NAME, CODE_T)                                                                           \
int64_t NAME(const CODE_T *codes, int64_t n, const double *qa, const int32_t *wrap2, int64_t s,             \
             bitgen_t *bg, int pcg64, int64_t *out) {                                                        \
    const double top = (double)(s - 2);                                                                      \
    double u[256];                                                                                           \
    uint64_t bad = 0;                                                                                        \
    source_t src;                                                                                            \
    source_init(&src, bg, pcg64);                                                                            \
    for (int64_t lo = 0; lo < n; lo += 256) {                                                                \
        int64_t w = n - lo < 256 ? n - lo : 256;                                                             \
        source_fill(&src, u, w);                                                                             \
        const CODE_T *c = codes + lo;                                                                        \
        int64_t *o = out + lo;                                                                               \
        for (int64_t j = 0; j < w; j++) {                                                                    \
            uint64_t x1 = (uint64_t)((int64_t)c[j] + 1);                                                     \
            bad |= x1 > (uint64_t)s;                                                                         \
            x1 = x1 > (uint64_t)s ? 0 : x1;                 /* never read outside the tables */              \
            const double *e = qa + 2 * x1;                                                                   \
            double t = (u[j] - e[0]) * e[1];                                                                 \
            t = t < -0.5 ? -0.5 : t;                                                                         \
            t = t > top ? top : t;                                                                           \
            int64_t f = (int64_t)t;                         /* floor: truncate, -1 below zero */             \
            f -= (t < 0.0);                                                                                  \
            o[j] = wrap2[(int64_t)x1 + f + 1];                                                               \
        }                                                                                                    \
    }                                                                                                        \
    if (bad)                                                                                                 \
        for (int64_t i = 0; i < n; i++)                                                                      \
            if (codes[i] < -1 || (int64_t)codes[i] >= s) return i;                                           \
    return -1;                                                                                               \
}

KEEP_UNIFORM(keep_uniform_i8, int8_t)
KEEP_UNIFORM(keep_uniform_i16, int16_t)
KEEP_UNIFORM(keep_uniform_i32, int32_t)
KEEP_UNIFORM(keep_uniform_i64, int64_t)

/* n uniforms from numpy's PCG64 (fastpath.py checks them against Generator.random before trusting the layout) */
void pcg64_fill(bitgen_t *bg, double *out, int64_t n) {
    source_t src;
    source_init(&src, bg, 1);
    for (int64_t lo = 0; lo < n; lo += 256) source_fill(&src, out + lo, n - lo < 256 ? n - lo : 256);
}
