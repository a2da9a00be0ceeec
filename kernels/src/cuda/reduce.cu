// oxccl's CUDA reduction kernels: dst[i] = op(src_0[i], .., src_{n-1}[i]).
//
// Self-contained on purpose: no headers, so NVRTC needs no include path
// (a user with only a driver has no CUDA headers), and the same file
// builds on the host with `-DOX_HOST` and a small shim
// (`kernels/tests/cuda_host.rs`), where its logic is tested against the
// host kernels' reference.
//
// Semantics, identical to the host kernels (`kernels/src/lib.rs`):
// - sources combine left to right in the order given (every rank that
//   passes the same sources in the same order gets the same bits);
// - integers wrap; float Min/Max propagate NaN (the first operand wins
//   ties, so min(-0, +0) is -0);
// - f16, bf16 and fp8 widen to f32, combine in f32 and round to nearest
//   even once per element; f32 and f64 combine in their own type;
// - Avg (`divisor` > 1) is the sum rounded to the element type, then
//   divided in the compute type and rounded again (as the host's
//   `reduce_n` followed by `div_assign`); integers truncate toward zero;
// - PreMulSum: sum of scalar[i] * src_i (the scalar in the element type,
//   one per source), in the compute type, without fused multiply-adds
//   (compiled with --fmad=false);
// - one source without a scalar or divisor is a byte copy.
// fp8: e4m3 is the "FN" variant (no infinities, 0x7f/0xff NaN, largest
// 448); e5m2 is IEEE-like (infinities, largest finite 57344). Narrowing to
// fp8 saturates to the largest finite value (infinities included) and
// keeps NaN a NaN, as CUDA's default (__NV_SATFINITE) conversions.

#ifdef OX_HOST
#include "shim.h"
#else
#define OX_DEV __device__ __forceinline__
#define OX_GLOBAL extern "C" __global__ void __launch_bounds__(512)
#endif

typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define OX_MAX_SOURCES 8

// The kernels' one argument, passed by value (152 bytes; `ReduceArgs` in
// `kernels/src/cuda/mod.rs` has the same layout).
struct OxArgs {
    u64 src[OX_MAX_SOURCES];     // device addresses of the sources
    u64 dst;                     // may equal a source (in place)
    u64 count;                   // elements
    u32 nsrc;                    // 1..=8
    u32 divisor;                 // Avg: divide by this (1: no division)
    u64 scalar[OX_MAX_SOURCES];  // PreMulSum: each source's factor, as element bits
};

enum { OP_SUM = 0, OP_PROD = 1, OP_MIN = 2, OP_MAX = 3, OP_PREMULSUM = 4 };

// ---- bit casts ----

OX_DEV u32 f32_bits(float f) {
#ifdef OX_HOST
    u32 b;
    __builtin_memcpy(&b, &f, 4);
    return b;
#else
    return __float_as_uint(f);
#endif
}

OX_DEV float bits_f32(u32 b) {
#ifdef OX_HOST
    float f;
    __builtin_memcpy(&f, &b, 4);
    return f;
#else
    return __uint_as_float(b);
#endif
}

OX_DEV bool f32_is_nan(float f) { return (f32_bits(f) & 0x7fffffffu) > 0x7f800000u; }

// Round a non-negative float holding at most 2^23 to the nearest integer,
// ties to even (the subnormal paths below: the scaled value is exact).
OX_DEV u32 round_even(float x) {
    u32 q = (u32)x;
    float frac = x - (float)q;
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) q += 1u;
    return q;
}

// ---- bf16 ----

OX_DEV float bf16_to_f32(u16 x) { return bits_f32((u32)x << 16); }

OX_DEV u16 f32_to_bf16(float f) {
    u32 b = f32_bits(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x0040u);
    return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// ---- f16 ----

OX_DEV float f16_to_f32_soft(u16 x) {
    u32 s = (u32)(x & 0x8000u) << 16;
    u32 e = (x >> 10) & 0x1fu;
    u32 m = x & 0x3ffu;
    if (e == 0x1fu) return bits_f32(s | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f; // m * 2^-24, exact
        return bits_f32(f32_bits(v) | s);
    }
    return bits_f32(s | ((e + 112u) << 23) | (m << 13));
}

OX_DEV u16 f32_to_f16_soft(float f) {
    u32 b = f32_bits(f);
    u16 s = (u16)((b >> 16) & 0x8000u);
    u32 a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return (u16)(s | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (u16)(s | 0x7c00u); // >= 65520: rounds to infinity
    if (a < 0x38800000u) {                           // below 2^-14: subnormal
        return (u16)(s | round_even(bits_f32(a) * 16777216.0f)); // * 2^24
    }
    u32 r = a - (112u << 23);
    u32 rem = r & 0x1fffu;
    r >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r += 1u;
    return (u16)(s | r);
}

OX_DEV float f16_to_f32(u16 x) {
#ifdef OX_HOST
    return f16_to_f32_soft(x);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
#endif
}

OX_DEV u16 f32_to_f16(float f) {
#ifdef OX_HOST
    return f32_to_f16_soft(f);
#else
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#endif
}

// ---- fp8 ----
// One pair of conversions for both formats: M mantissa bits, exponent
// bias B; IEEE (e5m2) has infinities and NaNs at the top exponent, FN
// (e4m3) only the NaN code 0x7f and finite values elsewhere.

template <u32 M, u32 B, bool IEEE> OX_DEV float fp8_to_f32(u8 x) {
    const u32 emax = 0x7fu >> M;
    u32 s = (u32)(x & 0x80u) << 24;
    u32 e = (x & 0x7fu) >> M;
    u32 m = x & ((1u << M) - 1u);
    if (IEEE && e == emax) return bits_f32(s | 0x7f800000u | (m << (23 - M)) | (m ? 0x400000u : 0u));
    if (!IEEE && (x & 0x7fu) == 0x7fu) return bits_f32(s | 0x7fc00000u);
    if (e == 0) return bits_f32(f32_bits((float)m * bits_f32((128u - B - M) << 23)) | s); // m * 2^(1-B-M)
    return bits_f32(s | ((e + 127u - B) << 23) | (m << (23 - M)));
}

// Round to nearest even, saturating to MAXCODE (whose value has the f32
// bits MAXF32), infinities included; NaN stays NaN (0x7f).
template <u32 M, u32 B, u32 MAXF32, u8 MAXCODE> OX_DEV u8 f32_to_fp8(float f) {
    u32 b = f32_bits(f);
    u8 s = (u8)((b >> 24) & 0x80u);
    u32 a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return (u8)(s | 0x7fu);
    if (a > MAXF32) return (u8)(s | MAXCODE);
    if (a < ((128u - B) << 23)) { // below the smallest normal: subnormal
        return (u8)(s | round_even(bits_f32(a) * bits_f32((126u + B + M) << 23))); // * 2^(B+M-1)
    }
    u32 r = a - ((127u - B) << 23);
    u32 rem = r & ((1u << (23 - M)) - 1u);
    r >>= 23 - M;
    const u32 half = 1u << (22 - M);
    if (rem > half || (rem == half && (r & 1u))) r += 1u;
    return (u8)(s | r);
}

OX_DEV float e4m3_to_f32(u8 x) { return fp8_to_f32<3, 7, false>(x); }
OX_DEV u8 f32_to_e4m3(float f) { return f32_to_fp8<3, 7, 0x43e00000u, 0x7e>(f); } // 448
OX_DEV float e5m2_to_f32(u8 x) { return fp8_to_f32<2, 15, true>(x); }
OX_DEV u8 f32_to_e5m2(float f) { return f32_to_fp8<2, 15, 0x47600000u, 0x7b>(f); } // 57344

// ---- element types: storage S, compute C, widen, narrow ----

template <class S_, class U_> struct Int {
    typedef S_ S;
    typedef S_ C;
    typedef U_ U; // unsigned twin: wrapping arithmetic without overflow
    static OX_DEV C widen(S x) { return x; }
    static OX_DEV S narrow(C x) { return x; }
    static OX_DEV C add(C a, C b) { return (C)(U)((U)a + (U)b); }
    static OX_DEV C mul(C a, C b) { return (C)(U)((U)a * (U)b); }
    static OX_DEV C div(C a, u32 n) { return (C)(a / (C)n); }
};

template <class S_> struct UInt {
    typedef S_ S;
    typedef S_ C;
    static OX_DEV C widen(S x) { return x; }
    static OX_DEV S narrow(C x) { return x; }
    static OX_DEV C add(C a, C b) { return (C)(a + b); }
    static OX_DEV C mul(C a, C b) { return (C)(a * b); }
    static OX_DEV C div(C a, u32 n) { return (C)(a / (C)n); }
};

// i8 and u8 promote to int in C++ arithmetic: compute in their unsigned
// 32-bit twin and truncate.
struct I8 {
    typedef i8 S;
    typedef i8 C;
    static OX_DEV C widen(S x) { return x; }
    static OX_DEV S narrow(C x) { return x; }
    static OX_DEV C add(C a, C b) { return (C)(u8)((u32)(u8)a + (u32)(u8)b); }
    static OX_DEV C mul(C a, C b) { return (C)(u8)((u32)(u8)a * (u32)(u8)b); }
    static OX_DEV C div(C a, u32 n) { return (C)((i32)a / (i32)n); }
};

struct U8 {
    typedef u8 S;
    typedef u8 C;
    static OX_DEV C widen(S x) { return x; }
    static OX_DEV S narrow(C x) { return x; }
    static OX_DEV C add(C a, C b) { return (C)((u32)a + (u32)b); }
    static OX_DEV C mul(C a, C b) { return (C)((u32)a * (u32)b); }
    static OX_DEV C div(C a, u32 n) { return (C)((u32)a / n); }
};

template <class S_> struct Float {
    typedef S_ S;
    typedef S_ C;
    static OX_DEV C widen(S x) { return x; }
    static OX_DEV S narrow(C x) { return x; }
    static OX_DEV C add(C a, C b) { return a + b; }
    static OX_DEV C mul(C a, C b) { return a * b; }
    static OX_DEV C div(C a, u32 n) { return a / (C)n; }
};

#define OX_NARROW_TYPE(NAME, STORAGE, TO_F32, FROM_F32)                          \
    struct NAME {                                                                \
        typedef STORAGE S;                                                       \
        typedef float C;                                                         \
        static OX_DEV C widen(S x) { return TO_F32(x); }                         \
        static OX_DEV S narrow(C x) { return FROM_F32(x); }                      \
        static OX_DEV C add(C a, C b) { return a + b; }                          \
        static OX_DEV C mul(C a, C b) { return a * b; }                          \
        static OX_DEV C div(C a, u32 n) { return a / (float)n; }                 \
    };
OX_NARROW_TYPE(F16, u16, f16_to_f32, f32_to_f16)
OX_NARROW_TYPE(BF16, u16, bf16_to_f32, f32_to_bf16)
OX_NARROW_TYPE(E4M3, u8, e4m3_to_f32, f32_to_e4m3)
OX_NARROW_TYPE(E5M2, u8, e5m2_to_f32, f32_to_e5m2)

typedef Int<i32, u32> I32;
typedef UInt<u32> U32;
typedef Int<i64, u64> I64;
typedef UInt<u64> U64;
typedef Float<float> F32;
typedef Float<double> F64;

// Is a float NaN (compute types only: integers never are).
template <class C> OX_DEV bool is_nan(C) { return false; }
template <> OX_DEV bool is_nan<float>(float x) { return f32_is_nan(x); }
template <> OX_DEV bool is_nan<double>(double x) { return x != x; }

template <class T, int OP> OX_DEV typename T::C combine(typename T::C a, typename T::C b) {
    if (OP == OP_PROD) return T::mul(a, b);
    if (OP == OP_MIN) {
        typename T::C r = b < a ? b : a;
        return is_nan(b) ? b : r;
    }
    if (OP == OP_MAX) {
        typename T::C r = b > a ? b : a;
        return is_nan(b) ? b : r;
    }
    return T::add(a, b); // SUM and PREMULSUM (its terms are premultiplied)
}

// A PreMulSum factor: the element's bits in the low bytes (little endian).
template <class T> OX_DEV typename T::C scalar_of(u64 bits) {
    union {
        u64 b;
        typename T::S s;
    } u;
    u.b = bits;
    return T::widen(u.s);
}

// One element j of the result, from scalar loads.
template <class T, int OP> OX_DEV typename T::S element(const OxArgs& a, u64 j) {
    typedef typename T::C C;
    C acc = T::widen(((const typename T::S*)a.src[0])[j]);
    if (OP == OP_PREMULSUM) acc = T::mul(scalar_of<T>(a.scalar[0]), acc);
#pragma unroll
    for (u32 i = 1; i < OX_MAX_SOURCES; i++) {
        if (i >= a.nsrc) break;
        C x = T::widen(((const typename T::S*)a.src[i])[j]);
        if (OP == OP_PREMULSUM) x = T::mul(scalar_of<T>(a.scalar[i]), x);
        acc = combine<T, OP>(acc, x);
    }
    typename T::S out = T::narrow(acc);
    if (a.divisor > 1) out = T::narrow(T::div(T::widen(out), a.divisor));
    return out;
}

// 16 bytes of elements, loaded and stored at once.
template <class S> union Vec16 {
    uint4 u;
    S e[16 / sizeof(S)];
};

template <class T, int OP> OX_DEV void reduce(const OxArgs& a) {
    typedef typename T::S S;
    typedef typename T::C C;
    const u32 V = 16 / sizeof(S);
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    // Whole 16-byte vectors only when every pointer is 16-byte aligned.
    u64 misaligned = a.dst;
    for (u32 i = 0; i < a.nsrc; i++) misaligned |= a.src[i];
    const u64 nvec = (misaligned & 15u) ? 0 : a.count / V;
    for (u64 v = tid; v < nvec; v += stride) {
        Vec16<S> in;
        in.u = ((const uint4*)a.src[0])[v];
        C acc[16 / sizeof(S)];
#pragma unroll
        for (u32 k = 0; k < V; k++) {
            acc[k] = T::widen(in.e[k]);
            if (OP == OP_PREMULSUM) acc[k] = T::mul(scalar_of<T>(a.scalar[0]), acc[k]);
        }
#pragma unroll
        for (u32 i = 1; i < OX_MAX_SOURCES; i++) {
            if (i >= a.nsrc) break;
            in.u = ((const uint4*)a.src[i])[v];
#pragma unroll
            for (u32 k = 0; k < V; k++) {
                C x = T::widen(in.e[k]);
                if (OP == OP_PREMULSUM) x = T::mul(scalar_of<T>(a.scalar[i]), x);
                acc[k] = combine<T, OP>(acc[k], x);
            }
        }
        Vec16<S> out;
#pragma unroll
        for (u32 k = 0; k < V; k++) {
            out.e[k] = T::narrow(acc[k]);
            if (a.divisor > 1) out.e[k] = T::narrow(T::div(T::widen(out.e[k]), a.divisor));
        }
        ((uint4*)a.dst)[v] = out.u;
    }
    for (u64 j = nvec * V + tid; j < a.count; j += stride) {
        ((S*)a.dst)[j] = element<T, OP>(a, j);
    }
}

// A byte copy (one source, nothing to apply): 16 bytes at a time when
// aligned, single bytes for the rest.
OX_GLOBAL ox_copy(OxArgs a) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 nvec = ((a.dst | a.src[0]) & 15u) ? 0 : a.count / 16;
    for (u64 v = tid; v < nvec; v += stride) ((uint4*)a.dst)[v] = ((const uint4*)a.src[0])[v];
    for (u64 j = nvec * 16 + tid; j < a.count; j += stride) ((u8*)a.dst)[j] = ((const u8*)a.src[0])[j];
}

#define OX_KERNEL(TYPE, NAME, OP, OPNAME) \
    OX_GLOBAL ox_reduce_##NAME##_##OPNAME(OxArgs a) { reduce<TYPE, OP>(a); }

#define OX_KERNELS(TYPE, NAME)                       \
    OX_KERNEL(TYPE, NAME, OP_SUM, sum)               \
    OX_KERNEL(TYPE, NAME, OP_PROD, prod)             \
    OX_KERNEL(TYPE, NAME, OP_MIN, min)               \
    OX_KERNEL(TYPE, NAME, OP_MAX, max)               \
    OX_KERNEL(TYPE, NAME, OP_PREMULSUM, premulsum)

// `-DOX_ONLY_DTYPE=n` compiles one dtype's kernels (n: its index in
// `Dtype::ALL`), a fraction of the whole file's compile time.
#ifdef OX_ONLY_DTYPE
#define OX_WANT(n) (OX_ONLY_DTYPE == (n))
#else
#define OX_WANT(n) 1
#endif

#if OX_WANT(0)
OX_KERNELS(I8, i8)
#endif
#if OX_WANT(1)
OX_KERNELS(U8, u8)
#endif
#if OX_WANT(2)
OX_KERNELS(I32, i32)
#endif
#if OX_WANT(3)
OX_KERNELS(U32, u32)
#endif
#if OX_WANT(4)
OX_KERNELS(I64, i64)
#endif
#if OX_WANT(5)
OX_KERNELS(U64, u64)
#endif
#if OX_WANT(6)
OX_KERNELS(F16, f16)
#endif
#if OX_WANT(7)
OX_KERNELS(BF16, bf16)
#endif
#if OX_WANT(8)
OX_KERNELS(F32, f32)
#endif
#if OX_WANT(9)
OX_KERNELS(F64, f64)
#endif
#if OX_WANT(10)
OX_KERNELS(E4M3, f8e4m3)
#endif
#if OX_WANT(11)
OX_KERNELS(E5M2, f8e5m2)
#endif
