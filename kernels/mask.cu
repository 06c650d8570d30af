// Mask stage kernels: shapes from half-planes, model masks resampled into the crop, parser classes.
//
// Twins: vcam/mask.py polygon_masks, resample_masks and parser_select (same arguments, same float32
// operation order; compiled with --fmad=false). Shapes travel by value in the parameter block, up
// to MASK_FACES faces per launch (the host loops over larger batches).
#include <cuda_fp16.h>

#define MASK_FACES 8
#define SHAPES 2
#define MAX_EDGES 16

struct Shapes {
    float planes[MASK_FACES][SHAPES][MAX_EDGES][3];  // (nx, ny, c): nx*x + ny*y + c > 0 outside
    float feather[MASK_FACES][SHAPES];               // crop pixels; 0: a hard edge
    int count;
    int mouth;  // shape 1 (the mouth) is cut out when set
};

// out[f] = base[f] * cover(face) * (1 - cover(mouth)); one thread per crop pixel, blockIdx.y = face.
extern "C" __global__ void polygon_masks(const float* __restrict__ base, int base_stride, int size, const Shapes p,
                                         float* __restrict__ out) {
    int f = blockIdx.y;
    if (f >= p.count) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= size * size) return;
    int y = i / size, x = i - y * size;
    float fx = (float)x, fy = (float)y;
    float m = base[(size_t)f * base_stride + i];
    for (int k = 0; k < SHAPES; ++k) {
        if (k == 1 && !p.mouth) continue;
        float d = __int_as_float(0xff800000);  // -inf
        for (int e = 0; e < MAX_EDGES; ++e) {
            const float* pl = p.planes[f][k][e];
            if (pl[2] <= -1e29f) continue;  // unused edge
            d = fmaxf(d, (pl[0] * fx + pl[1] * fy) + pl[2]);
        }
        float w = p.feather[f][k];
        float cov = w > 0.0f ? fminf(fmaxf(-d / w, 0.0f), 1.0f) : (d < 0.0f ? 1.0f : 0.0f);
        m *= (k == 0) ? cov : (1.0f - cov);
    }
    out[(size_t)f * size * size + i] = m;
}

// The same shapes with their geometry computed here from 5 crop-space points per face (the host
// passes only the points): twin of vcam/mask.py landmark_masks. Threads 0..31 of each block map the
// 16 local face and 16 mouth half-planes into shared memory, then every thread evaluates its pixel.
#define LM_FACES 32

struct Landmarks {
    float lm[LM_FACES][10];  // (x, y) of left eye, right eye, nose, left and right mouth corner
    float face_local[MAX_EDGES][3];
    float mouth_local[MAX_EDGES][3];
    float centre_u, centre_v;  // face centre in (eye line, eye-to-mouth) units
    float face_scale, mouth_scale, feather, across;
    int count, face, mouth;
};

__device__ void mapped_plane(const float* l, float cx, float cy, float a, float b, float c, float d, float empty_c,
                             int k, float* out) {
    float det = a * d - b * c;
    if (fabsf(det) < 1e-9f) {
        out[0] = 0.0f;
        out[1] = 0.0f;
        out[2] = k == 0 ? empty_c : -1e30f;
        return;
    }
    float nx = (d * l[0] - c * l[1]) / det;
    float ny = (a * l[1] - b * l[0]) / det;
    float cw = (l[2] - nx * cx) - ny * cy;
    float norm = sqrtf(nx * nx + ny * ny);
    out[0] = nx / norm;
    out[1] = ny / norm;
    out[2] = cw / norm;
}

__device__ void landmark_masks_impl(const float* __restrict__ base, int base_stride, int size, const Landmarks& p,
                                    float* __restrict__ out) {
    __shared__ float planes[SHAPES][MAX_EDGES][3];
    __shared__ float feathers[SHAPES];
    int f = blockIdx.y;
    if (f >= p.count) return;  // uniform per block: before the barrier
    const float* l = p.lm[f];
    float ex = (l[0] + l[2]) * 0.5f, ey = (l[1] + l[3]) * 0.5f;
    float mx = (l[6] + l[8]) * 0.5f, my = (l[7] + l[9]) * 0.5f;
    float vx = mx - ex, vy = my - ey;
    int t = threadIdx.x;
    if (t < MAX_EDGES && p.face) {
        float ux = l[2] - l[0], uy = l[3] - l[1];
        float cx = (ex + p.centre_u * ux) + p.centre_v * vx;
        float cy = (ey + p.centre_u * uy) + p.centre_v * vy;
        float s = p.face_scale;
        mapped_plane(p.face_local[t], cx, cy, ux * s, vx * s, uy * s, vy * s, 1e30f, t, planes[0][t]);
    } else if (t >= MAX_EDGES && t < 2 * MAX_EDGES && p.mouth) {
        int k = t - MAX_EDGES;
        float ax = ((l[8] - l[6]) * 0.6f) * p.mouth_scale, ay = ((l[9] - l[7]) * 0.6f) * p.mouth_scale;
        mapped_plane(p.mouth_local[k], mx, my, ax, -ay * p.across, ay, ax * p.across, 1e30f, k, planes[1][k]);
    }
    if (t == 0) {
        float width = sqrtf(vx * vx + vy * vy) * p.feather;
        feathers[0] = width;
        feathers[1] = width * 0.5f;
    }
    __syncthreads();
    int i = blockIdx.x * blockDim.x + t;
    if (i >= size * size) return;
    int y = i / size, x = i - y * size;
    float fx = (float)x, fy = (float)y;
    float m = base[(size_t)f * base_stride + i];
    for (int k = 0; k < SHAPES; ++k) {
        if ((k == 0 && !p.face) || (k == 1 && !p.mouth)) continue;
        float d = __int_as_float(0xff800000);  // -inf
        for (int e = 0; e < MAX_EDGES; ++e) {
            const float* pl = planes[k][e];
            if (pl[2] <= -1e29f) continue;
            d = fmaxf(d, (pl[0] * fx + pl[1] * fy) + pl[2]);
        }
        float w = feathers[k];
        float cov = w > 0.0f ? fminf(fmaxf(-d / w, 0.0f), 1.0f) : (d < 0.0f ? 1.0f : 0.0f);
        m *= (k == 0) ? cov : (1.0f - cov);
    }
    out[(size_t)f * size * size + i] = m;
}

extern "C" __global__ void landmark_masks(const float* __restrict__ base, int base_stride, int size, const Landmarks p,
                                          float* __restrict__ out) {
    landmark_masks_impl(base, base_stride, size, p, out);
}

// The same, the landmarks read from a device parameter record (vcam/kernels/records.py).
extern "C" __global__ void landmark_masks_rec(const float* __restrict__ base, int base_stride, int size,
                                              const Landmarks* __restrict__ p, float* __restrict__ out) {
    landmark_masks_impl(base, base_stride, size, *p, out);
}

__device__ __forceinline__ float load(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float load(const __half* p, size_t i) { return __half2float(p[i]); }

__device__ __forceinline__ void axis(int i, float ratio, int n, int* i0, int* i1, float* frac) {
    float pos = ((float)i + 0.5f) * ratio - 0.5f;
    pos = fminf(fmaxf(pos, 0.0f), (float)(n - 1));
    int a = (int)floorf(pos);
    *i0 = a;
    *i1 = min(a + 1, n - 1);
    *frac = pos - (float)a;
}

// out[f] *= clip((bilinear(src[f]) - lo) * scale, 0, 1); a non-finite sample gives 0 and flags guard[f].
template <typename T>
__device__ void resample_impl(const T* __restrict__ src, int hs, int ws, float ry, float rx, int count, int size,
                              float lo, float scale, int* __restrict__ guard, int use_guard, float* __restrict__ out) {
    int f = blockIdx.y;
    if (f >= count) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= size * size) return;
    int y = i / size, x = i - y * size;
    int y0, y1, x0, x1;
    float fy, fx;
    axis(y, ry, hs, &y0, &y1, &fy);
    axis(x, rx, ws, &x0, &x1, &fx);
    const T* s = src + (size_t)f * hs * ws;
    float top = load(s, (size_t)y0 * ws + x0) * (1.0f - fx) + load(s, (size_t)y0 * ws + x1) * fx;
    float bot = load(s, (size_t)y1 * ws + x0) * (1.0f - fx) + load(s, (size_t)y1 * ws + x1) * fx;
    float v = top * (1.0f - fy) + bot * fy;
    if (!isfinite(v)) {
        v = 0.0f;
        if (use_guard) guard[f] = 1;
    } else {
        v = fminf(fmaxf((v - lo) * scale, 0.0f), 1.0f);
    }
    out[(size_t)f * size * size + i] *= v;
}

extern "C" __global__ void resample_masks_f32(const float* __restrict__ src, int hs, int ws, float ry, float rx, int count,
                                              int size, float lo, float scale, int* __restrict__ guard, int use_guard,
                                              float* __restrict__ out) {
    resample_impl<float>(src, hs, ws, ry, rx, count, size, lo, scale, guard, use_guard, out);
}

extern "C" __global__ void resample_masks_f16(const __half* __restrict__ src, int hs, int ws, float ry, float rx,
                                              int count, int size, float lo, float scale, int* __restrict__ guard,
                                              int use_guard, float* __restrict__ out) {
    resample_impl<__half>(src, hs, ws, ry, rx, count, size, lo, scale, guard, use_guard, out);
}

// out[f] = 1 where the arg-max class (first on ties) is in the bit set `classes`, else 0.
template <typename T>
__device__ void select_impl(const T* __restrict__ logits, int classes_n, int hw, int count, long long classes,
                            int* __restrict__ guard, float* __restrict__ out) {
    int f = blockIdx.y;
    if (f >= count) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= hw) return;
    const T* l = logits + (size_t)f * classes_n * hw + i;
    float best = __int_as_float(0xff800000);  // -inf
    int arg = 0;
    bool bad = false;
    for (int c = 0; c < classes_n; ++c) {
        float v = load(l, (size_t)c * hw);
        if (!isfinite(v)) {
            bad = true;
            continue;
        }
        if (v > best) {
            best = v;
            arg = c;
        }
    }
    float keep = (float)((classes >> arg) & 1LL);
    if (bad) {
        keep = 0.0f;
        guard[f] = 1;
    }
    out[(size_t)f * hw + i] = keep;
}

extern "C" __global__ void parser_select_f32(const float* __restrict__ logits, int classes_n, int hw, int count,
                                             long long classes, int* __restrict__ guard, float* __restrict__ out) {
    select_impl<float>(logits, classes_n, hw, count, classes, guard, out);
}

extern "C" __global__ void parser_select_f16(const __half* __restrict__ logits, int classes_n, int hw, int count,
                                             long long classes, int* __restrict__ guard, float* __restrict__ out) {
    select_impl<__half>(logits, classes_n, hw, count, classes, guard, out);
}
