// The frame enhancer's tiles (vcam/upscale.py): feathered accumulation of a batch of upscaled tiles
// into a frame-sized float accumulator, its normalisation to uint8 BGR, and the bilinear resize of the
// cheap path.
//
// Twins: vcam/upscale.py accumulate_tiles, normalize_tiles and resize_bilinear (the last within one
// level: the CPU path resizes with OpenCV). Pixels in float32 in the twins' operation order (compiled
// with --fmad=false); sample coordinates in float64, as kernels/warp.cu.
#include <cuda_fp16.h>

#define MAX_TILES 64

// Per-launch tile parameters, passed by value: no host-to-device copy per frame.
struct Tiles {
    int x[MAX_TILES];      // output column of each tile's left edge
    int y[MAX_TILES];      // output row of each tile's top edge
    int flags[MAX_TILES];  // feathered sides: 1 left, 2 right, 4 top, 8 bottom
    int count;
    int box[4];            // x0, y0, x1, y1: the batch's tiles' union, clipped to the frame (output px)
};

__device__ __forceinline__ void sample_bgr(const unsigned char* __restrict__ frame, int width, int height,
                                           double x, double y, float* out3) {
    x = fmin(fmax(x, 0.0), (double)(width - 1));
    y = fmin(fmax(y, 0.0), (double)(height - 1));
    int x0 = (int)floor(x), y0 = (int)floor(y);
    int x1 = min(x0 + 1, width - 1), y1 = min(y0 + 1, height - 1);
    float fx = (float)(x - x0), fy = (float)(y - y0);
    const unsigned char* r0 = frame + (size_t)y0 * width * 3;
    const unsigned char* r1 = frame + (size_t)y1 * width * 3;
    for (int c = 0; c < 3; ++c) {
        float top = (float)r0[x0 * 3 + c] * (1.0f - fx) + (float)r0[x1 * 3 + c] * fx;
        float bot = (float)r1[x0 * 3 + c] * (1.0f - fx) + (float)r1[x1 * 3 + c] * fx;
        out3[c] = top * (1.0f - fy) + bot * fy;
    }
}

// NaN guard: one block per tile of the model output (count, 3, size, size). bad[t] = the tile holds
// NaN/Inf (this call), guard[t] += bad[t] (a running count per batch slot, read now and then).
template <typename T>
__device__ void tiles_guard_impl(const T* __restrict__ output, int count, int size, int* __restrict__ bad,
                                 int* __restrict__ guard) {
    int t = blockIdx.x;
    if (t >= count) return;
    size_t n = (size_t)3 * size * size;
    const T* o = output + (size_t)t * n;
    int b = 0;
    for (size_t k = threadIdx.x; k < n; k += blockDim.x) {
        if (!isfinite((float)o[k])) b = 1;
    }
    b = __syncthreads_or(b);
    if (threadIdx.x == 0) {
        bad[t] = b;
        guard[t] += b;
    }
}

extern "C" __global__ void tiles_guard_f32(const float* __restrict__ output, int count, int size,
                                           int* __restrict__ bad, int* __restrict__ guard) {
    tiles_guard_impl<float>(output, count, size, bad, guard);
}

extern "C" __global__ void tiles_guard_f16(const __half* __restrict__ output, int count, int size,
                                           int* __restrict__ bad, int* __restrict__ guard) {
    tiles_guard_impl<__half>(output, count, size, bad, guard);
}

// Accumulate the batch: one thread per output pixel of the batch's box; it adds every tile of the
// batch that covers it, in tile order, so the sum has the twin's order and needs no atomics:
//   acc[y, x, c] += w * v,  acc[y, x, 3] += w,  w = weights[fy][ty] * weights[fx][tx]
// with fx = flags & 3 and fy = (flags >> 2) & 3 picking the profile (feathered low side, high side;
// weights (4, size) float32), v = clip(output, 0, 1) * 255 in BGR order (`rgb`: the model's channels
// are R, G, B). A bad tile (bad[t] != 0) adds the bilinear resize of the frame instead (the same
// sample as resize_bilinear), so a NaN tile degrades to the cheap path, seamlessly.
// acc (out_h, out_w, 4) float32; frame (height, width, 3) uint8 BGR.
template <typename T>
__device__ void tiles_accumulate_impl(const T* __restrict__ output, const int* __restrict__ bad, const Tiles& p,
                                      int size, const float* __restrict__ weights,
                                      const unsigned char* __restrict__ frame, int width, int height, double sx,
                                      double sy, int rgb, float* __restrict__ acc, int out_w) {
    int bw = p.box[2] - p.box[0];
    int bh = p.box[3] - p.box[1];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= bw * bh) return;
    int y = p.box[1] + i / bw;
    int x = p.box[0] + i % bw;
    size_t plane = (size_t)size * size;
    float* a = acc + ((size_t)y * out_w + x) * 4;
    float s0 = a[0], s1 = a[1], s2 = a[2], s3 = a[3];
    bool any = false;
    for (int t = 0; t < p.count; ++t) {
        int tx = x - p.x[t], ty = y - p.y[t];
        if (tx < 0 || ty < 0 || tx >= size || ty >= size) continue;
        int f = p.flags[t];
        float w = weights[((f >> 2) & 3) * size + ty] * weights[(f & 3) * size + tx];
        float v[3];
        if (bad[t]) {
            sample_bgr(frame, width, height, ((double)x + 0.5) * sx - 0.5, ((double)y + 0.5) * sy - 0.5, v);
        } else {
            const T* o = output + (size_t)t * 3 * plane + (size_t)ty * size + tx;
            for (int c = 0; c < 3; ++c) {
                int m = rgb ? 2 - c : c;  // model channel of BGR channel c
                v[c] = fminf(fmaxf((float)o[m * plane], 0.0f), 1.0f) * 255.0f;
            }
        }
        s0 = s0 + w * v[0];
        s1 = s1 + w * v[1];
        s2 = s2 + w * v[2];
        s3 = s3 + w;
        any = true;
    }
    if (any) {
        a[0] = s0;
        a[1] = s1;
        a[2] = s2;
        a[3] = s3;
    }
}

#define TILES_ACCUMULATE(NAME, T)                                                                           \
    extern "C" __global__ void NAME(const T* __restrict__ output, const int* __restrict__ bad, const Tiles p, \
                                    int size, const float* __restrict__ weights,                              \
                                    const unsigned char* __restrict__ frame, int width, int height, double sx,  \
                                    double sy, int rgb, float* __restrict__ acc, int out_w) {                   \
        tiles_accumulate_impl<T>(output, bad, p, size, weights, frame, width, height, sx, sy, rgb, acc, out_w);  \
    }

TILES_ACCUMULATE(tiles_accumulate_f32, float)
TILES_ACCUMULATE(tiles_accumulate_f16, __half)

// out (n pixels, 3) uint8 BGR = clip(floor(acc[:3] / acc[3] + 0.5), 0, 255); 0 where no weight.
extern "C" __global__ void tiles_normalize(const float* __restrict__ acc, long long n, unsigned char* __restrict__ out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float4 a = reinterpret_cast<const float4*>(acc)[i];
    float v[3] = {a.x, a.y, a.z};
    unsigned char* o = out + i * 3;
    for (int c = 0; c < 3; ++c) {
        float r = a.w > 0.0f ? floorf(v[c] / a.w + 0.5f) : 0.0f;
        o[c] = (unsigned char)fminf(fmaxf(r, 0.0f), 255.0f);
    }
}

// Bilinear resize (half-pixel centres, replicate border): out (out_h, out_w, 3) uint8 BGR, output pixel
// (x, y) samples the frame at ((x + 0.5) * sx - 0.5, (y + 0.5) * sy - 0.5), sx = width / out_w.
extern "C" __global__ void resize_bilinear(const unsigned char* __restrict__ frame, int width, int height, double sx,
                                           double sy, unsigned char* __restrict__ out, int out_w, int out_h) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)out_w * out_h) return;
    int y = (int)(i / out_w), x = (int)(i % out_w);
    float s[3];
    sample_bgr(frame, width, height, ((double)x + 0.5) * sx - 0.5, ((double)y + 0.5) * sy - 0.5, s);
    unsigned char* o = out + i * 3;
    for (int c = 0; c < 3; ++c) {
        float r = floorf(s[c] + 0.5f);
        o[c] = (unsigned char)fminf(fmaxf(r, 0.0f), 255.0f);
    }
}
