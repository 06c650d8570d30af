// Batched affine warp-crop of every face of a frame in one launch (bilinear, replicate border).
//
// Twins: vcam/align.py warp_crops (uint8 BGR crops) and warp_crops_normalized (planar model input,
// float32 or float16, optional BGR->RGB swap, (x - mean) / std). Coordinates in float64, pixels in
// float32, same operation order as NumPy (compiled with --fmad=false).
#include <cuda_fp16.h>

#define MAX_FACES 32

// Per-launch face parameters, passed by value (no host-to-device copy per frame) or, in the _rec
// kernels, read from a parameter record on the device.
struct Faces {
    double frame_from_crop[MAX_FACES][6];  // row-major (2, 3): crop pixel centre -> frame point
    float mean[3];                         // output channel order
    float std[3];
    int count;
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

__device__ __forceinline__ void crop_to_frame(const double* m, int u, int v, double* x, double* y) {
    *x = m[0] * (double)u + m[1] * (double)v + m[2];
    *y = m[3] * (double)u + m[4] * (double)v + m[5];
}

// out (count, size, size, 3) uint8 BGR; grid.x covers size*size pixels, grid.y is the face.
extern "C" __global__ void warp_crops_u8(const unsigned char* __restrict__ frame, int width, int height,
                                         const Faces faces, int size, unsigned char* __restrict__ out) {
    int f = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= faces.count || i >= size * size) return;
    int v = i / size, u = i - v * size;
    double x, y;
    crop_to_frame(faces.frame_from_crop[f], u, v, &x, &y);
    float s[3];
    sample_bgr(frame, width, height, x, y, s);
    unsigned char* o = out + ((size_t)f * size * size + i) * 3;
    for (int c = 0; c < 3; ++c) {
        float r = floorf(s[c] + 0.5f);
        o[c] = (unsigned char)fminf(fmaxf(r, 0.0f), 255.0f);
    }
}

template <typename T>
__device__ __forceinline__ void put(T* p, float v);
template <>
__device__ __forceinline__ void put<float>(float* p, float v) { *p = v; }
template <>
__device__ __forceinline__ void put<__half>(__half* p, float v) { *p = __float2half_rn(v); }

template <typename T>
__device__ void warp_norm_impl(const unsigned char* __restrict__ frame, int width, int height, const Faces& faces,
                               int size, int rgb, T* __restrict__ out) {
    int f = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= faces.count || i >= size * size) return;
    int v = i / size, u = i - v * size;
    double x, y;
    crop_to_frame(faces.frame_from_crop[f], u, v, &x, &y);
    float s[3];
    sample_bgr(frame, width, height, x, y, s);
    size_t plane = (size_t)size * size;
    T* o = out + (size_t)f * 3 * plane + i;
    for (int c = 0; c < 3; ++c) {
        float val = rgb ? s[2 - c] : s[c];
        put<T>(o + c * plane, (val - faces.mean[c]) / faces.std[c]);
    }
}

extern "C" __global__ void warp_crops_norm_f32(const unsigned char* __restrict__ frame, int width, int height,
                                               const Faces faces, int size, int rgb, float* __restrict__ out) {
    warp_norm_impl<float>(frame, width, height, faces, size, rgb, out);
}

extern "C" __global__ void warp_crops_norm_f16(const unsigned char* __restrict__ frame, int width, int height,
                                               const Faces faces, int size, int rgb, __half* __restrict__ out) {
    warp_norm_impl<__half>(frame, width, height, faces, size, rgb, out);
}

// The same, the faces read from a device parameter record (vcam/kernels/records.py) instead of passed
// by value: a captured CUDA graph replays these with the record's address, whose contents change.
extern "C" __global__ void warp_crops_norm_f32_rec(const unsigned char* __restrict__ frame, int width, int height,
                                                   const Faces* __restrict__ faces, int size, int rgb,
                                                   float* __restrict__ out) {
    warp_norm_impl<float>(frame, width, height, *faces, size, rgb, out);
}

extern "C" __global__ void warp_crops_norm_f16_rec(const unsigned char* __restrict__ frame, int width, int height,
                                                   const Faces* __restrict__ faces, int size, int rgb,
                                                   __half* __restrict__ out) {
    warp_norm_impl<__half>(frame, width, height, *faces, size, rgb, out);
}

// Model output per channel -> pixel: value01 = output * out_scale + out_shift (then clipped to [0, 1]);
// the NaN guard's fallback reads the model input back as pixel = input * in_scale + in_shift (0..255).
// Both in the model's channel order.
struct Affine {
    float out_scale[3];
    float out_shift[3];
    float in_scale[3];
    float in_shift[3];
};

// Model output (count, 3, size, size) planar (float32 or float16) -> uint8 BGR crops (count, size,
// size, 3), one block per face; `rgb` != 0: model channels are R, G, B. FP16 guard: a face whose
// output holds NaN/Inf gets its own input crop back (the unswapped target) and `guard[f]` grows by
// one (a running count per face slot that the status reads now and then, never per frame).
template <typename T, typename U>
__device__ void crops_from_planar_impl(const T* __restrict__ output, const U* __restrict__ input, int count,
                                       int size, const Affine& a, int rgb, unsigned char* __restrict__ crops,
                                       int* __restrict__ guard) {
    int f = blockIdx.x;
    if (f >= count) return;
    size_t plane = (size_t)size * size;
    const T* o = output + (size_t)f * 3 * plane;
    int bad = 0;
    for (size_t k = threadIdx.x; k < 3 * plane; k += blockDim.x) {
        float val = (float)o[k];
        if (!isfinite(val)) bad = 1;
    }
    bad = __syncthreads_or(bad);
    const U* in = input + (size_t)f * 3 * plane;
    unsigned char* dst = crops + (size_t)f * plane * 3;
    for (size_t k = threadIdx.x; k < plane; k += blockDim.x) {
        for (int c = 0; c < 3; ++c) {  // c: BGR channel of the crop
            int m = rgb ? 2 - c : c;     // model channel
            float val;
            if (bad) {
                val = (float)in[m * plane + k] * a.in_scale[m] + a.in_shift[m];
            } else {
                val = (float)o[m * plane + k] * a.out_scale[m] + a.out_shift[m];
                val = fminf(fmaxf(val, 0.0f), 1.0f) * 255.0f;
            }
            val = floorf(val + 0.5f);
            dst[k * 3 + c] = (unsigned char)fminf(fmaxf(val, 0.0f), 255.0f);
        }
    }
    if (threadIdx.x == 0) guard[f] += bad;
}

// Output dtype first, input dtype second (an FP16 engine takes half inputs and may declare float outputs).
#define CROPS_FROM_PLANAR(NAME, T, U)                                                                     \
    extern "C" __global__ void NAME(const T* __restrict__ output, const U* __restrict__ input, int count,   \
                                    int size, const Affine a, int rgb, unsigned char* __restrict__ crops,     \
                                    int* __restrict__ guard) {                                                \
        crops_from_planar_impl<T, U>(output, input, count, size, a, rgb, crops, guard);                      \
    }

CROPS_FROM_PLANAR(crops_from_planar_f32_f32, float, float)
CROPS_FROM_PLANAR(crops_from_planar_f32_f16, float, __half)
CROPS_FROM_PLANAR(crops_from_planar_f16_f32, __half, float)
CROPS_FROM_PLANAR(crops_from_planar_f16_f16, __half, __half)
