/* Family (8) sampler in C: the same arithmetic as pram_lib.core.perturb's numpy kernel, one pass instead of nine;
 * and, at the end, SipHash-2-4 for pram_lib.core.memo.
 *
 * Uniforms are given (a randomness.Replay), or come from the caller's numpy Generator, 256 at a time, exactly as
 * Generator.random(out=) draws them, so for the same generator state the output, and the state left behind, are
 * identical to the numpy kernel's. Two generator sources:
 *  - any bit generator, through its bitgen_t (numpy/random/bitgen.h; restated here, no numpy headers needed);
 *  - numpy's PCG64, stepped here (pcg64_fill): the same 128-bit LCG and XSL-RR output, four states apart at a
 *    time (state' = a^4 state + c(a^3 + a^2 + a + 1)), so four multiplications are in flight instead of one
 *    per value behind a function pointer. fastpath.py checks the state layout against numpy before use.
 * Built by `python -m pram_lib.core.fastpath` (make install); pram_lib works without it.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
 * decision is the sign of t = (u - q) a (exact: t < 0 iff u < q), a move goes floor(t) + 1 places on.
 * KEEP_BLOCK writes o[0..w) from c[0..w) and u[0..w), and ORs into `bad` whether any code was out of range. */
#define KEEP_BLOCK(CODE_T)                                                                                   \
static inline uint64_t keep_block_##CODE_T(const CODE_T *c, const double *u, int64_t w, const double *qa,    \
                                           const int32_t *wrap2, int64_t s, int64_t *o) {                    \
    const double top = (double)(s - 2);                                                                      \
    uint64_t bad = 0;                                                                                        \
    for (int64_t j = 0; j < w; j++) {                                                                        \
        uint64_t x1 = (uint64_t)((int64_t)c[j] + 1);                                                         \
        bad |= x1 > (uint64_t)s;                                                                             \
        x1 = x1 > (uint64_t)s ? 0 : x1;                 /* never read outside the tables */                  \
        const double *e = qa + 2 * x1;                                                                       \
        double t = (u[j] - e[0]) * e[1];                                                                     \
        t = t < -0.5 ? -0.5 : t;                                                                             \
        t = t > top ? top : t;                                                                               \
        int64_t f = (int64_t)t;                         /* floor: truncate, -1 below zero */                 \
        f -= (t < 0.0);                                                                                      \
        o[j] = wrap2[(int64_t)x1 + f + 1];                                                                   \
    }                                                                                                        \
    return bad;                                                                                              \
}

KEEP_BLOCK(int8_t)
KEEP_BLOCK(int16_t)
KEEP_BLOCK(int32_t)
KEEP_BLOCK(int64_t)

/* the first code out of [-1, s-1], or -1 */
#define FIRST_BAD(codes, n, s)                                                                               \
    for (int64_t i = 0; i < (n); i++)                                                                        \
        if ((codes)[i] < -1 || (int64_t)(codes)[i] >= (s)) return i;                                         \
    return -1;

/* uniforms from the caller's Generator, 256 at a time, as Generator.random(out=) draws them */
#define KEEP_UNIFORM(NAME, CODE_T)                                                                           \
int64_t NAME(const CODE_T *codes, int64_t n, const double *qa, const int32_t *wrap2, int64_t s,             \
             bitgen_t *bg, int pcg64, int64_t *out) {                                                        \
    double u[256];                                                                                           \
    uint64_t bad = 0;                                                                                        \
    source_t src;                                                                                            \
    source_init(&src, bg, pcg64);                                                                            \
    for (int64_t lo = 0; lo < n; lo += 256) {                                                                \
        int64_t w = n - lo < 256 ? n - lo : 256;                                                             \
        source_fill(&src, u, w);                                                                             \
        bad |= keep_block_##CODE_T(codes + lo, u, w, qa, wrap2, s, out + lo);                                \
    }                                                                                                        \
    if (!bad) return -1;                                                                                     \
    FIRST_BAD(codes, n, s)                                                                                   \
}

/* the same with the uniforms given (u[i] for codes[i]): randomness.Replay, e.g. memo.KeyedPrf.uniforms */
#define KEEP_UNIFORM_GIVEN(NAME, CODE_T)                                                                     \
int64_t NAME(const CODE_T *codes, int64_t n, const double *qa, const int32_t *wrap2, int64_t s,             \
             const double *u, int64_t *out) {                                                                \
    if (!keep_block_##CODE_T(codes, u, n, qa, wrap2, s, out)) return -1;                                     \
    FIRST_BAD(codes, n, s)                                                                                   \
}

/* the same with keyed hashes given (h[i] for codes[i]: memo.KeyedReplay), each read as the uniform (h >> 11) 2^-53
 * (memo.hash_to_uniform's), 256 at a time into a buffer: no array of uniforms is made */
#define KEEP_UNIFORM_HASHED(NAME, CODE_T)                                                                    \
int64_t NAME(const CODE_T *codes, int64_t n, const double *qa, const int32_t *wrap2, int64_t s,             \
             const uint64_t *h, int64_t *out) {                                                              \
    double u[256];                                                                                           \
    uint64_t bad = 0;                                                                                        \
    for (int64_t lo = 0; lo < n; lo += 256) {                                                                \
        int64_t w = n - lo < 256 ? n - lo : 256;                                                             \
        for (int64_t j = 0; j < w; j++) u[j] = (double)(int64_t)(h[lo + j] >> 11) * (1.0 / 9007199254740992.0); \
        bad |= keep_block_##CODE_T(codes + lo, u, w, qa, wrap2, s, out + lo);                                \
    }                                                                                                        \
    if (!bad) return -1;                                                                                     \
    FIRST_BAD(codes, n, s)                                                                                   \
}

KEEP_UNIFORM(keep_uniform_i8, int8_t)
KEEP_UNIFORM(keep_uniform_i16, int16_t)
KEEP_UNIFORM(keep_uniform_i32, int32_t)
KEEP_UNIFORM(keep_uniform_i64, int64_t)
KEEP_UNIFORM_HASHED(keep_hashed_i8, int8_t)
KEEP_UNIFORM_HASHED(keep_hashed_i16, int16_t)
KEEP_UNIFORM_HASHED(keep_hashed_i32, int32_t)
KEEP_UNIFORM_HASHED(keep_hashed_i64, int64_t)
KEEP_UNIFORM_GIVEN(keep_given_i8, int8_t)
KEEP_UNIFORM_GIVEN(keep_given_i16, int16_t)
KEEP_UNIFORM_GIVEN(keep_given_i32, int32_t)
KEEP_UNIFORM_GIVEN(keep_given_i64, int64_t)

/* n uniforms from numpy's PCG64 (fastpath.py checks them against Generator.random before trusting the layout) */
void pcg64_fill(bitgen_t *bg, double *out, int64_t n) {
    source_t src;
    source_init(&src, bg, 1);
    for (int64_t lo = 0; lo < n; lo += 256) source_fill(&src, out + lo, n - lo < 256 ? n - lo : 256);
}

/* SipHash-2-4 (Aumasson & Bernstein, "SipHash: a fast short-input PRF", 2012) of the 24-byte message made of the
 * three little-endian words (w0[i], tag, w2[i]) under the 128-bit key (k0, k1): the three words and the length
 * block (24 << 56) of two rounds each, four finalisation rounds. pram_lib.core.memo has the same in numpy. */
#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                             \
    do {                                                                                                     \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                                            \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                                               \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                                               \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                                            \
    } while (0)
#define SIPBLOCK(m) do { v3 ^= (m); SIPROUND; SIPROUND; v0 ^= (m); } while (0)

static inline uint64_t sip24_3w(uint64_t k0, uint64_t k1, uint64_t m0, uint64_t m1, uint64_t m2) {
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    SIPBLOCK(m0);
    SIPBLOCK(m1);
    SIPBLOCK(m2);
    SIPBLOCK((uint64_t)24 << 56);
    v2 ^= 0xff;
    SIPROUND; SIPROUND; SIPROUND; SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* AVX-512 and AVX2 clones beside the baseline one, the best the CPU runs chosen when the library loads (GCC/clang
 * function multiversioning): the compiler vectorises the rows' independent hashes, four to an AVX2 register (about
 * twice the baseline's rate) or eight to an AVX-512 one, whose native 64-bit rotate (vprolq) replaces AVX2's
 * shift-shift-or (measured on this machine's Xeon: 6 ns a hash against 16 with AVX2). Integer arithmetic and
 * exactly rounded IEEE operations: every clone gives the same bits. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef MULTIVERSION
#define MULTIVERSION
#endif

MULTIVERSION
void siphash24_3w(const uint64_t *w0, uint64_t tag, const uint64_t *w2, int64_t n, uint64_t k0, uint64_t k1,
                  uint64_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = sip24_3w(k0, k1, w0[i], tag, w2[i]);
}

/* the hashes as doubles: (h >> 11) 2^-53 in [0, 1); or, when `open`, ((h >> 12) + 1/2) 2^-52 in (0, 1), exact (with 53
 * bits k + 1/2 would need 54 and the largest would round to 1.0). Hashed 256 at a time into a buffer, then
 * converted (as signed: it fits), so that the hash loop stays vectorised. */
MULTIVERSION
void siphash24_3w_uniforms(const uint64_t *w0, uint64_t tag, const uint64_t *w2, int64_t n, uint64_t k0,
                           uint64_t k1, int open, double *out) {
    const int drop = open ? 12 : 11;
    const double half = open ? 0.5 : 0.0, scale = open ? 1.0 / 4503599627370496.0 : 1.0 / 9007199254740992.0;
    uint64_t h[256];
    for (int64_t lo = 0; lo < n; lo += 256) {
        int64_t w = n - lo < 256 ? n - lo : 256;
        for (int64_t j = 0; j < w; j++) h[j] = sip24_3w(k0, k1, w0[lo + j], tag, w2[lo + j]);
        for (int64_t j = 0; j < w; j++) out[lo + j] = ((double)(int64_t)(h[j] >> drop) + half) * scale;
    }
}

/* pram_lib.core.memo.hash_to_uniform in one pass: the same doubles. */
MULTIVERSION
void hash_uniforms(const uint64_t *h, int64_t n, int open, double *out) {
    const int drop = open ? 12 : 11;
    const double half = open ? 0.5 : 0.0, scale = open ? 1.0 / 4503599627370496.0 : 1.0 / 9007199254740992.0;
    for (int64_t i = 0; i < n; i++) out[i] = ((double)(int64_t)(h[i] >> drop) + half) * scale;
}

/* The per-record ledger's lookup for pram_lib.ops.panel: each tag's row in the ledger `records` (m rows, in the
 * order of the release that wrote them), -1 when absent, and the found rows' cumulative ε and per-variable last pair
 * tags (0.0 and 0 when absent). A release of the same people in the same order reads the ledger in order: row i's
 * guess is the row after the last one found (the first row's: `guess`), or the one after that (a record that left);
 * the guess is checked against the tag. A tag that misses its guess is looked up in the tag index: `sorted` (the
 * tags in increasing order) and `by_tag` (their rows; NULL: the ledger is itself sorted), through `index[b]`, the
 * first position whose tag >> shift is at least b (b = 0 .. 2^(64-shift)): the tags are keyed hashes, uniform on
 * 64 bits, so a bucket holds a few. Misses are looked up at once while they stay few (a newcomer; the cursor moves
 * to the row found), else left to a second pass that takes them LOOKUP_BATCH at a time through three stages, each
 * prefetching what the next reads (bucket, position, row), so that a source in another order waits on memory for
 * many lookups at once. Variable v's last pairs are lasts[v][row * strides[v]]: the columns of one row-major table
 * (a record's pairs share a cache line) or separate arrays. `loss` NULL: rows only (loss_out is not written).
 * Returns how many tags were found, or -1 - i when the index sends tag i to a row that holds another tag. */
#define LOOKUP_BATCH 64

static inline int64_t index_find(const uint64_t *sorted, const int64_t *index, int shift, uint64_t t) {
    int64_t a = index[t >> shift], e = index[(t >> shift) + 1];
    while (a < e && sorted[a] < t) a++;
    return (a < e && sorted[a] == t) ? a : -1;
}

int64_t panel_lookup(const uint64_t *records, int64_t m, const uint64_t *sorted, const int64_t *by_tag,
                     const int64_t *index, int shift, const double *loss, const uint64_t *const *lasts,
                     const int64_t *strides, int64_t nv, const uint64_t *tags, int64_t n, int64_t guess,
                     int64_t *pos, double *loss_out, uint64_t *const *lasts_out) {
    int64_t g = guess < 0 ? 0 : guess, deferred = 0, misses = 0;
    for (int64_t i = 0; i < n; i++) {               /* pass 1: in order */
        uint64_t t = tags[i];
        int64_t p;
        if (g < m && records[g] == t) p = g;
        else if (g + 1 < m && records[g + 1] == t) p = g + 1;
        else if (++misses <= 64 + (i >> 4)) {
            int64_t k = index_find(sorted, index, shift, t);
            p = k < 0 ? -1 : by_tag ? by_tag[k] : k;
            if (p >= 0 && records[p] != t) return -1 - i;
        } else {
            pos[i] = -2;                            /* left to pass 2 */
            deferred++;
            continue;
        }
        pos[i] = p;
        if (p >= 0) g = p + 1;
    }
    if (deferred) {                                 /* pass 2: the rest, LOOKUP_BATCH at a time */
        int64_t at[LOOKUP_BATCH], lo[LOOKUP_BATCH], hi[LOOKUP_BATCH], k[LOOKUP_BATCH];
        int64_t i = 0;
        while (i < n) {
            int w = 0;
            for (; i < n && w < LOOKUP_BATCH; i++)
                if (pos[i] == -2) {
                    at[w++] = i;
                    __builtin_prefetch(&index[tags[i] >> shift]);
                }
            for (int j = 0; j < w; j++) {
                uint64_t b = tags[at[j]] >> shift;
                lo[j] = index[b];
                hi[j] = index[b + 1];
                __builtin_prefetch(&sorted[lo[j]]);
            }
            for (int j = 0; j < w; j++) {
                uint64_t t = tags[at[j]];
                int64_t a = lo[j], e = hi[j];
                while (a < e && sorted[a] < t) a++;
                k[j] = (a < e && sorted[a] == t) ? a : -1;
                if (k[j] >= 0 && by_tag) __builtin_prefetch(&by_tag[k[j]]);
            }
            for (int j = 0; j < w; j++) {
                int64_t p = k[j] < 0 ? -1 : by_tag ? by_tag[k[j]] : k[j];
                if (p >= 0) __builtin_prefetch(&records[p]);
                pos[at[j]] = p;
            }
            for (int j = 0; j < w; j++) {
                int64_t p = pos[at[j]];
                if (p >= 0 && records[p] != tags[at[j]]) return -1 - at[j];
            }
        }
    }
    int64_t found = 0;
    for (int64_t i = 0; i < n; i++) {               /* the rows' ε and last pairs */
        int64_t p = pos[i];
        found += p >= 0;
        if (loss) loss_out[i] = p >= 0 ? loss[p] : 0.0;
        for (int64_t v = 0; v < nv; v++) lasts_out[v][i] = p >= 0 ? lasts[v][p * strides[v]] : 0;
    }
    return found;
}

/* MemoChunk.admit's accounting of one variable over a chunk's n rows, in one pass (pram_lib.ops.panel; its numpy
 * twin is MemoChunk.account_numpy, which gives the same arrays). Row i's pair hash h[i] is its record's last
 * released pair when the record is in the ledger (pos[i] >= 0) and last[pos[i] * stride] == h[i] (`last`: the
 * ledger's column of the variable, read in place); else it is new to the record
 * unless the sorted `history` (nhistory pairs released before, no longer a record's last) holds it. `last` NULL:
 * the ledger does not account the variable (every pair new). A new pair of a live row costs eps pico-ε if the
 * row's loss stays within cap (it is then added to loss[i] and charge[i]), else the row is blocked (ok[i] = 0).
 * moved[] gets the rows whose pair becomes their record's last (live, ok, not already the last), in order;
 * counts = {paid rows already in the ledger, blocked rows}. Returns how many rows were moved. */
int64_t panel_admit(const uint64_t *h, const uint64_t *last, int64_t stride, const int64_t *pos, const uint8_t *live,
                    const uint64_t *history, int64_t nhistory, double eps, double cap, double *loss, double *charge,
                    uint8_t *ok, int64_t *moved, int64_t *counts, int64_t n) {
    int64_t k = 0, changed = 0, blocked = 0;
    for (int64_t i = 0; i < n; i++) {
        int known = pos[i] >= 0;
        int is_last = last != NULL && known && last[pos[i] * stride] == h[i];
        int fresh = !is_last;
        if (fresh && known && last != NULL && nhistory > 0) {   /* np.searchsorted's left side */
            int64_t lo = 0, hi = nhistory;
            while (lo < hi) {
                int64_t mid = lo + ((hi - lo) >> 1);
                if (history[mid] < h[i]) lo = mid + 1; else hi = mid;
            }
            fresh = !(lo < nhistory && history[lo] == h[i]);
        }
        fresh = fresh && live[i];
        int o = !fresh || loss[i] + eps <= cap;
        if (fresh && o) {
            loss[i] += eps;
            charge[i] += eps;
            changed += known;
        }
        blocked += !o;
        ok[i] = (uint8_t)o;
        if (live[i] && o && !is_last) moved[k++] = i;
    }
    counts[0] = changed;
    counts[1] = blocked;
    return k;
}

/* The order of n distinct tags (np.argsort's) for a ledger's tag index: a counting sort on the top bits (tag >>
 * shift, `buckets` of them, a power of 2), then each bucket sorted (insertion sort while it is small, else heapsort:
 * the tags are keyed hashes, a few per bucket, but the result never depends on that). The counting sort runs as two
 * (most significant digit first): on the top 8 bits, whose 256 write streams stay in the cache, then each of those
 * buckets on the remaining bits and FINER_BITS more, copied into a scratch buffer the cache holds (one pass on all
 * the bits scattered 10^7 tags over 160 MB at random: 0.22-0.29 s against 0.10-0.12 s, on the AMD EPYC of
 * 2026-12-03). Writes sorted[]
 * (the tags in increasing order), rows[] (their positions in tags[]) and index[] (panel_index's bucket index of
 * sorted[]). Returns 0, or -1 when memory for the scratch buffers could not be had (nothing written). */
static void sift(uint64_t *t, int64_t *r, int64_t root, int64_t end) {
    for (;;) {
        int64_t child = 2 * root + 1;
        if (child >= end) return;
        if (child + 1 < end && t[child + 1] > t[child]) child++;
        if (t[root] >= t[child]) return;
        uint64_t x = t[root]; t[root] = t[child]; t[child] = x;
        int64_t y = r[root]; r[root] = r[child]; r[child] = y;
        root = child;
    }
}

static void bucket_sort(uint64_t *t, int64_t *r, int64_t k) {
    if (k <= 32) {
        for (int64_t i = 1; i < k; i++) {
            uint64_t x = t[i];
            int64_t y = r[i], j = i - 1;
            while (j >= 0 && t[j] > x) { t[j + 1] = t[j]; r[j + 1] = r[j]; j--; }
            t[j + 1] = x;
            r[j + 1] = y;
        }
        return;
    }
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift(t, r, i, k);
    for (int64_t end = k - 1; end > 0; end--) {
        uint64_t x = t[0]; t[0] = t[end]; t[end] = x;
        int64_t y = r[0]; r[0] = r[end]; r[end] = y;
        sift(t, r, 0, end);
    }
}

#define FINER_BITS 3   /* the second pass sorts on 3 bits more than the index has: buckets of about 1 tag */

/* the counts of the k tags t[] by digit (t >> shift) & (nb - 1), as bucket starts: start[d] for d = 0 .. nb */
static void digit_starts(const uint64_t *t, int64_t k, int shift, int64_t nb, int64_t *start) {
    memset(start, 0, (size_t)(nb + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < k; i++) start[((t[i] >> shift) & (uint64_t)(nb - 1)) + 1]++;
    for (int64_t d = 0; d < nb; d++) start[d + 1] += start[d];
}

/* the k tags t[] and their rows r[] (r NULL: 0 .. k - 1) into out_t[], out_r[] by digit, stable, given the digit
 * starts (`next`: nb cursors of scratch) */
static void digit_scatter(const uint64_t *t, const int64_t *r, int64_t k, int shift, int64_t nb, const int64_t *start,
                          int64_t *next, uint64_t *out_t, int64_t *out_r) {
    memcpy(next, start, (size_t)nb * sizeof(int64_t));
    for (int64_t i = 0; i < k; i++) {
        int64_t at = next[(t[i] >> shift) & (uint64_t)(nb - 1)]++;
        out_t[at] = t[i];
        out_r[at] = r == NULL ? i : r[i];
    }
}

/* the digits of a tag sort with the bucket index's `buckets` (tag >> shift): the top `top` bits (at most 8: the first
 * pass), then within each of those buckets `subs` index buckets, sorted on FINER_BITS more (`fines` digits); with
 * the cursors and digit starts of one bucket */
typedef struct {
    int shift, top, finer;
    int64_t tops, subs, fines, *next, *fine;
} TagDigits;

static int tag_digits(TagDigits *d, int shift, int64_t buckets) {
    int bits = 64 - shift;
    d->shift = shift;
    d->top = bits < 8 ? bits : 8;
    d->finer = shift < FINER_BITS ? shift : FINER_BITS;
    d->tops = (int64_t)1 << d->top;
    d->subs = buckets >> d->top;
    d->fines = d->subs << d->finer;
    d->next = malloc((size_t)(d->tops >= d->fines ? d->tops + 1 : d->fines) * sizeof(int64_t));
    d->fine = malloc((size_t)(d->fines + 1) * sizeof(int64_t));
    if (d->next == NULL || d->fine == NULL) { free(d->next); free(d->fine); return -1; }
    return 0;
}

static void tag_digits_free(TagDigits *d) { free(d->next); free(d->fine); }

/* the k tags src_t[] (rows src_r[]) of one top bucket sorted into out_t[], out_r[]; index_at (or NULL) gets the
 * bucket's `subs` index entries, counted from `lo` (the bucket's first row in the whole sort) */
static void sort_top_bucket(TagDigits *d, const uint64_t *src_t, const int64_t *src_r, int64_t k, uint64_t *out_t,
                            int64_t *out_r, int64_t *index_at, int64_t lo) {
    digit_starts(src_t, k, d->shift - d->finer, d->fines, d->fine);
    digit_scatter(src_t, src_r, k, d->shift - d->finer, d->fines, d->fine, d->next, out_t, out_r);
    for (int64_t j = 0; j < d->fines; j++)
        bucket_sort(out_t + d->fine[j], out_r + d->fine[j], d->fine[j + 1] - d->fine[j]);
    if (index_at != NULL)
        for (int64_t j = 0; j < d->subs; j++) index_at[j] = lo + d->fine[j << d->finer];
}

/* the k tags out_t[lo..], out_r[lo..] of one top bucket copied into the scratch scr_t[], scr_r[] (the cache holds it)
 * and sorted back into place (sort_top_bucket) */
static void resort_top_bucket(TagDigits *d, uint64_t *out_t, int64_t *out_r, int64_t lo, int64_t k, uint64_t *scr_t,
                              int64_t *scr_r, int64_t *index_at) {
    memcpy(scr_t, out_t + lo, (size_t)k * sizeof(uint64_t));
    memcpy(scr_r, out_r + lo, (size_t)k * sizeof(int64_t));
    sort_top_bucket(d, scr_t, scr_r, k, out_t + lo, out_r + lo, index_at, lo);
}

int64_t tag_sort(const uint64_t *tags, int64_t n, int shift, int64_t buckets, int64_t *index, uint64_t *sorted,
                 int64_t *rows) {
    TagDigits d;
    int64_t largest = 0;
    if (tag_digits(&d, shift, buckets)) return -1;
    int64_t *start = malloc((size_t)(d.tops + 1) * sizeof(int64_t));
    if (start == NULL) { tag_digits_free(&d); return -1; }
    digit_starts(tags, n, 64 - d.top, d.tops, start);
    for (int64_t b = 0; b < d.tops; b++)
        if (start[b + 1] - start[b] > largest) largest = start[b + 1] - start[b];
    uint64_t *part_t = malloc((size_t)largest * sizeof(uint64_t) + 1);
    int64_t *part_r = malloc((size_t)largest * sizeof(int64_t) + 1);
    if (part_t == NULL || part_r == NULL) {
        tag_digits_free(&d); free(start); free(part_t); free(part_r);
        return -1;
    }
    digit_scatter(tags, NULL, n, 64 - d.top, d.tops, start, d.next, sorted, rows);
    for (int64_t b = 0; b < d.tops; b++)
        resort_top_bucket(&d, sorted, rows, start[b], start[b + 1] - start[b], part_t, part_r, index + b * d.subs);
    index[buckets] = n;
    tag_digits_free(&d); free(start); free(part_t); free(part_r);
    return 0;
}

/* tag_sort a part at a time, for output that is written out as it is made: tag_top_starts gives the starts of the
 * first pass's buckets (start[b] for b = 0 .. 2^top, top = min(8, 64 - shift)); tag_sort_part sorts the tags of
 * top buckets b_lo .. b_hi - 1 (one scan of all n tags) into out_t[], out_r[] (start[b_hi] - start[b_lo] of them,
 * their rows in tags[], and one slot more), each top bucket through scratch scr_t[], scr_r[] of the largest's size.
 * Each returns 0, or -1 when memory for the digits could not be had (nothing written). */
int64_t tag_top_starts(const uint64_t *tags, int64_t n, int shift, int64_t *start) {
    int bits = 64 - shift, top = bits < 8 ? bits : 8;
    digit_starts(tags, n, 64 - top, (int64_t)1 << top, start);
    return 0;
}

int64_t tag_sort_part(const uint64_t *tags, int64_t n, int shift, int64_t buckets, const int64_t *start, int64_t b_lo,
                      int64_t b_hi, uint64_t *out_t, int64_t *out_r, uint64_t *scr_t, int64_t *scr_r) {
    TagDigits d;
    if (tag_digits(&d, shift, buckets)) return -1;
    int64_t base = start[b_lo], width = b_hi - b_lo;
    for (int64_t b = b_lo; b < b_hi; b++) d.next[b - b_lo] = start[b] - base;
    d.next[width] = start[b_hi] - base;   /* the tags of other buckets all go to this one slot past the part */
    for (int64_t i = 0; i < n; i++) {   /* without a branch: a part is a random fraction of keyed tags */
        uint64_t b = (tags[i] >> (64 - d.top)) - (uint64_t)b_lo;
        uint64_t in = b < (uint64_t)width;
        int64_t slot = in ? (int64_t)b : width;
        int64_t at = d.next[slot];
        out_t[at] = tags[i];
        out_r[at] = i;
        d.next[slot] = at + (int64_t)in;
    }
    for (int64_t b = b_lo; b < b_hi; b++)
        resort_top_bucket(&d, out_t, out_r, start[b] - base, start[b + 1] - start[b], scr_t, scr_r, NULL);
    tag_digits_free(&d);
    return 0;
}

/* panel_lookup's bucket index of the sorted tags `records` (m of them): index[b] = the first row whose tag >> shift is at
 * least b, for b = 0 .. buckets (index[buckets] = m); one pass over the ledger. */
void panel_index(const uint64_t *records, int64_t m, int shift, int64_t buckets, int64_t *index) {
    int64_t b = 0;
    for (int64_t i = 0; i < m; i++) {
        int64_t k = (int64_t)(records[i] >> shift);
        while (b <= k) index[b++] = i;
    }
    while (b <= buckets) index[b++] = m;
}

/* The two-sided Gamma noise of pram_lib.channels.gamma_law.sample_keyed, drawn from keyed uniforms: row i's stream
 * is u(j) = the open uniform of SipHash-2-4 (h[i], tag, j), j = 0, 1, ... Marsaglia & Tsang (2000) for shape a (the
 * caller passes d = a - 1/3, c = 1/sqrt(9d)), attempts repeated until one is accepted (an exact rejection sampler:
 * the attempts are independent). Attempts 2m and 2m+1 take the two normals of one Box-Muller pair (u(1+4m),
 * u(2+4m)), cosine then sine, and the acceptance uniforms u(3+4m) and u(4+4m); Marsaglia & Tsang's squeeze
 * u < 1 - 0.0331 x^4 first, their logarithmic test only when it fails. For a shape below 1 (`boost` = 1/theta
 * > 0) G u(0)^(1/theta); the sign is the lowest bit of u(0)'s hash, which its uniform (the top 52 bits) does not
 * use. The numpy twin (sample_keyed_numpy) computes the same expressions in the same order: same values. */
static inline double open_uniform(uint64_t h) { return ((double)(int64_t)(h >> 12) + 0.5) * (1.0 / 4503599627370496.0); }

static double gamma_attempts(const uint64_t hi, uint64_t tag, uint64_t k0, uint64_t k1, double d, double c,
                             double twopi, double r, double angle, uint64_t k) {
    /* attempts k, k+1, ... of one row (r and angle: the Box-Muller pair of attempt k - 1 when k is odd) */
    for (;; k++) {
        uint64_t m = k >> 1;
        double x;
        if ((k & 1) == 0) {
            r = sqrt(-2.0 * log(open_uniform(sip24_3w(k0, k1, hi, tag, 1 + 4 * m))));
            angle = twopi * open_uniform(sip24_3w(k0, k1, hi, tag, 2 + 4 * m));
            x = r * cos(angle);
        } else {
            x = r * sin(angle);
        }
        double u = open_uniform(sip24_3w(k0, k1, hi, tag, 3 + 4 * m + (k & 1)));
        double t = 1.0 + c * x;
        double v = t * t * t;
        if (v > 0.0 && (u < 1.0 - 0.0331 * (x * x) * (x * x) || log(u) < 0.5 * x * x + d * (1.0 - v + log(v))))
            return d * v;
    }
}

/* the first attempt's four hashes are made 256 rows at a time (the hash loops vectorise); a rejected row (a few per
 * cent) goes on alone */
MULTIVERSION
void gamma_keyed(const uint64_t *h, int64_t n, uint64_t tag, uint64_t k0, uint64_t k1, double d, double c,
                 double boost, double eta, double twopi, double *out) {
    uint64_t s0[256], s1[256], s2[256], s3[256];
    for (int64_t lo = 0; lo < n; lo += 256) {
        int64_t w = n - lo < 256 ? n - lo : 256;
        for (int64_t j = 0; j < w; j++) s0[j] = sip24_3w(k0, k1, h[lo + j], tag, 0);
        for (int64_t j = 0; j < w; j++) s1[j] = sip24_3w(k0, k1, h[lo + j], tag, 1);
        for (int64_t j = 0; j < w; j++) s2[j] = sip24_3w(k0, k1, h[lo + j], tag, 2);
        for (int64_t j = 0; j < w; j++) s3[j] = sip24_3w(k0, k1, h[lo + j], tag, 3);
        for (int64_t j = 0; j < w; j++) {
            double r = sqrt(-2.0 * log(open_uniform(s1[j])));
            double angle = twopi * open_uniform(s2[j]);
            double x = r * cos(angle);
            double u = open_uniform(s3[j]);
            double t = 1.0 + c * x;
            double v = t * t * t, g;
            if (v > 0.0 && (u < 1.0 - 0.0331 * (x * x) * (x * x) || log(u) < 0.5 * x * x + d * (1.0 - v + log(v))))
                g = d * v;
            else
                g = gamma_attempts(h[lo + j], tag, k0, k1, d, c, twopi, r, angle, 1);
            if (boost > 0.0) {
                double u0 = open_uniform(s0[j]);
                g = g * (boost == 2.0 ? u0 * u0 : pow(u0, boost));
            }
            out[lo + j] = (s0[j] & 1) ? -(eta * g) : eta * g;
        }
    }
}
