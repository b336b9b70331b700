/* SiLU's second-order backward in one pass (see act.py): for the first derivative's inputs g, x and the
 * incoming gradient gout,
 *
 *   dg[i] = gout[i] * silu'(x[i])            silu'(x)  = s (1 + x (1 - s))
 *   dx[i] = gout[i] * g[i] * silu''(x[i])    silu''(x) = s (1 - s) (2 + x (1 - 2 s)),   s = sigmoid(x)
 *
 * where torch needs seven passes over the tensors. A NULL output is not computed. float uses a
 * vectorisable exp (Cody-Waite reduction, degree-6 polynomial: relative error below 2e-7, below
 * float32's own rounding of the result), double uses libm's exp. NaN propagates; |x| beyond 87 is
 * evaluated at 87 in exp (sigmoid is then 1 or below 1.7e-38, as in float32 arithmetic).
 */
#include <math.h>
#include <stdint.h>

static inline float exp_neg_f32(float t) { /* exp(-t) for 0 <= t <= 87 (NaN in, NaN out) */
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    float n = __builtin_roundf(t * log2e);
    float r = (n * ln2_hi - t) + n * ln2_lo; /* -t - (-n) ln2, in [-ln2/2, ln2/2] */
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { float f; int32_t i; } scale;
    scale.i = (int32_t)(127 - (int32_t)n) << 23; /* 2^-n, n <= 126 */
    return p * scale.f;
}

/* s = sigmoid(x) and c = 1 - s, each from exp(-|x|) without cancellation (1 - s is not formed: where s
 * rounds to 1, c is still exp(-x) / (1 + exp(-x))) */
static inline void sigmoid_pair_f32(float x, float *s, float *c) {
    float ax = x < 0 ? -x : x;
    float t = ax > 87.0f ? 87.0f : ax; /* NaN stays NaN: the comparison is false */
    float e = exp_neg_f32(t);
    float inv = 1.0f / (1.0f + e), ei = e * inv;
    *s = x >= 0 ? inv : ei; /* NaN: ei = NaN */
    *c = x >= 0 ? ei : inv;
    if (x != x) *c = x;
}

static inline void sigmoid_pair_f64(double x, double *s, double *c) {
    double e = exp(-fabs(x)), inv = 1.0 / (1.0 + e), ei = e * inv;
    *s = x >= 0 ? inv : ei;
    *c = x >= 0 ? ei : inv;
    if (x != x) *s = *c = x;
}

#define DEFINE_SILU(REAL, SFX)                                                                             \
int silu_gradgrad_##SFX(int64_t n, const REAL *gout, const REAL *g, const REAL *x, REAL *dg, REAL *dx) {  \
    for (int64_t i = 0; i < n; i++) {                                                                      \
        REAL s, c;                                                                                         \
        const REAL xi = x[i];                                                                              \
        sigmoid_pair_##SFX(xi, &s, &c);                                                                    \
        if (dg) dg[i] = gout[i] * s * (1 + xi * c);                                                        \
        if (dx) dx[i] = gout[i] * g[i] * (s * c) * (2 + xi * (c - s));                                     \
    }                                                                                                      \
    return 0;                                                                                              \
}

DEFINE_SILU(float, f32)
DEFINE_SILU(double, f64)
