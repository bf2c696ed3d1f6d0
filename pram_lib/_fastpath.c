/* Family (8) sampler in C: the same arithmetic as pram_lib.perturb's numpy kernel, one pass instead of nine.
 *
 * Uniforms come from the caller's numpy Generator through its bitgen_t (numpy/random/bitgen.h), 256 at a
 * time, exactly as Generator.random(out=) draws them, so for the same generator state the output is
 * identical to the numpy kernel's. No numpy headers are needed: bitgen_t is restated here.
 * Built by `python -m pram_lib.fastpath` (make install); pram_lib works without it.
 */
#include <stdint.h>

typedef struct bitgen {
    void *state;
    uint64_t (*next_uint64)(void *st);
    uint32_t (*next_uint32)(void *st);
    double (*next_double)(void *st);
    uint64_t (*next_raw)(void *st);
} bitgen_t;

/* codes in [-1, s-1] (-1 = missing); qa[2(x+1)], qa[2(x+1)+1]: threshold and scale of category x (entry 0:
 * missing); wrap2[j+2] = (j + 1) mod s for j in [-1, 2s-3], wrap2[0] = -1 (missing).
 * Returns -1, or the index of the first code out of range (the output is then garbage; the caller raises). */
int64_t keep_uniform(const int64_t *codes, int64_t n, const double *qa, const int64_t *wrap2, int64_t s,
                     bitgen_t *bg, int64_t *out) {
    const double top = (double)(s - 2);
    double (*next)(void *) = bg->next_double;
    void *st = bg->state;
    double u[256];
    int64_t bad = 0;
    for (int64_t lo = 0; lo < n; lo += 256) {
        int64_t w = n - lo < 256 ? n - lo : 256;
        for (int64_t j = 0; j < w; j++) u[j] = next(st);
        const int64_t *c = codes + lo;
        int64_t *o = out + lo;
        for (int64_t j = 0; j < w; j++) {
            int64_t x = c[j];
            bad |= (x < -1) | (x >= s);
            x = x < -1 ? -1 : (x >= s ? s - 1 : x);      /* never read outside the tables */
            const double *e = qa + 2 * (x + 1);
            double t = (u[j] - e[0]) * e[1];             /* exact sign: t < 0 iff u < q */
            t = t < -1.0 ? -1.0 : t;
            t = t > top ? top : t;
            int64_t f = (int64_t)t;                      /* floor without libm: truncate, then step down */
            f -= (t < (double)f);
            o[j] = wrap2[x + f + 2];
        }
    }
    if (bad)
        for (int64_t i = 0; i < n; i++)
            if (codes[i] < -1 || codes[i] >= s) return i;
    return -1;
}
