// Colour conversion kernels: camera formats -> BGR frame, BGR frame -> virtual-camera formats,
// and the fused detector-input kernel (all regions of a frame in one launch).
//
// Twins (same arithmetic, float32 pixels, float64 coordinates): vcam/convert.py to_bgr, from_bgr,
// detector_input.
//
// The frame kernels convert the rows row0 .. row0+rows of the frame only (a band: the rows around the
// faces go first, the rest of the frame beside the swap, see vcam/pipeline.py); every row depends on
// its own source rows alone (4:2:0 chroma is nearest, not interpolated), so bands of even rows put
// together give the whole frame's result exactly. BT.601 limited range. Compiled with --fmad=false so the float order of operations
// matches NumPy's (no fused multiply-add), which keeps rounding differences below one level.
#include <cuda_fp16.h>

#define YC 1.164383f
#define RV 1.596027f
#define GU -0.391762f
#define GV -0.812968f
#define BU 2.017232f
#define Y_R 0.256788f
#define Y_G 0.504129f
#define Y_B 0.097906f
#define U_R -0.148223f
#define U_G -0.290993f
#define U_B 0.439216f
#define V_R 0.439216f
#define V_G -0.367788f
#define V_B -0.071427f

#define MAX_REGIONS 32

__device__ __forceinline__ unsigned char clamp_round(float v) {
    v = floorf(v + 0.5f);
    return (unsigned char)fminf(fmaxf(v, 0.0f), 255.0f);
}

__device__ __forceinline__ void yuv_to_bgr(float y, float u, float v, unsigned char* o) {
    float c = y - 16.0f, d = u - 128.0f, e = v - 128.0f;
    o[2] = clamp_round(YC * c + RV * e);
    o[1] = clamp_round(YC * c + GU * d + GV * e);
    o[0] = clamp_round(YC * c + BU * d);
}

// Packed 8-bit input with `channels` per pixel (1: gray, 3: BGR/RGB, 4: BGRA/RGBA) -> BGR.
// `swap_rb` != 0 reads R first (RGB/RGBA input).
extern "C" __global__ void bgr_from_packed(const unsigned char* __restrict__ src, int width, int height,
                                           int row0, int rows, int channels, int swap_rb,
                                           unsigned char* __restrict__ dst) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= width * rows) return;
    size_t i = (size_t)row0 * width + k;
    const unsigned char* p = src + (size_t)i * channels;
    unsigned char* o = dst + (size_t)i * 3;
    if (channels == 1) {
        o[0] = o[1] = o[2] = p[0];
    } else if (swap_rb) {
        o[0] = p[2]; o[1] = p[1]; o[2] = p[0];
    } else {
        o[0] = p[0]; o[1] = p[1]; o[2] = p[2];
    }
}

// Planar RGB (three width*height planes, R first: what nvJPEG decodes a JPEG to) -> BGR, one
// thread per pixel.
extern "C" __global__ void bgr_from_planar(const unsigned char* __restrict__ src, int width, int height,
                                           int row0, int rows, unsigned char* __restrict__ dst) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= width * rows) return;
    size_t n = (size_t)width * height;
    size_t i = (size_t)row0 * width + k;
    unsigned char* o = dst + (size_t)i * 3;
    o[0] = src[2 * n + i];
    o[1] = src[n + i];
    o[2] = src[i];
}

// YUYV (Y0 U Y1 V per pixel pair) -> BGR, one thread per pixel.
extern "C" __global__ void bgr_from_yuyv(const unsigned char* __restrict__ src, int width, int height,
                                         int row0, int rows, unsigned char* __restrict__ dst) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= width * rows) return;
    int row = row0 + k / width, col = k % width;
    size_t i = (size_t)row * width + col;
    const unsigned char* pair = src + (size_t)row * width * 2 + (size_t)(col >> 1) * 4;
    yuv_to_bgr((float)pair[(col & 1) * 2], (float)pair[1], (float)pair[3], dst + (size_t)i * 3);
}

// NV12 (nv12 != 0) or I420 -> BGR, one thread per pixel; even width, height and row0.
extern "C" __global__ void bgr_from_420(const unsigned char* __restrict__ src, int width, int height, int row0,
                                        int rows, int nv12, unsigned char* __restrict__ dst) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= width * rows) return;
    int row = row0 + k / width, col = k % width;
    size_t i = (size_t)row * width + col;
    int cw = width >> 1, ch = height >> 1;
    size_t plane = (size_t)width * height;
    size_t ci = (size_t)(row >> 1) * cw + (col >> 1);
    float u, v;
    if (nv12) {
        u = (float)src[plane + ci * 2];
        v = (float)src[plane + ci * 2 + 1];
    } else {
        u = (float)src[plane + ci];
        v = (float)src[plane + (size_t)cw * ch + ci];
    }
    yuv_to_bgr((float)src[i], u, v, dst + (size_t)i * 3);
}

// BGR -> RGB (also serves BGR -> BGR with swap_rb = 0).
extern "C" __global__ void bgr_to_packed(const unsigned char* __restrict__ src, int width, int height, int row0,
                                         int rows, int swap_rb, unsigned char* __restrict__ dst) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= width * rows) return;
    size_t i = (size_t)row0 * width + k;
    const unsigned char* p = src + (size_t)i * 3;
    unsigned char* o = dst + (size_t)i * 3;
    if (swap_rb) { o[0] = p[2]; o[1] = p[1]; o[2] = p[0]; }
    else { o[0] = p[0]; o[1] = p[1]; o[2] = p[2]; }
}

// BGR -> I420 / NV12, one thread per 2x2 block: four luma samples and one chroma pair; even row0
// and rows.
extern "C" __global__ void bgr_to_420(const unsigned char* __restrict__ src, int width, int height, int row0,
                                      int rows, int nv12, unsigned char* __restrict__ dst) {
    int cw = width >> 1, ch = height >> 1;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= cw * (rows >> 1)) return;
    int by = (row0 >> 1) + t / cw, bx = t % cw;
    int i = by * cw + bx;
    float rs = 0.0f, gs = 0.0f, bs = 0.0f;
    // Same summation order as NumPy's mean over the (2, 2) axes: rows of the block, then columns.
    float r4[4], g4[4], b4[4];
    for (int k = 0; k < 4; ++k) {
        int y = by * 2 + (k >> 1), x = bx * 2 + (k & 1);
        const unsigned char* p = src + ((size_t)y * width + x) * 3;
        float b = (float)p[0], g = (float)p[1], r = (float)p[2];
        b4[k] = b; g4[k] = g; r4[k] = r;
        dst[(size_t)y * width + x] = clamp_round(16.0f + Y_R * r + Y_G * g + Y_B * b);
    }
    rs = ((r4[0] + r4[2]) + (r4[1] + r4[3])) * 0.25f;
    gs = ((g4[0] + g4[2]) + (g4[1] + g4[3])) * 0.25f;
    bs = ((b4[0] + b4[2]) + (b4[1] + b4[3])) * 0.25f;
    unsigned char u = clamp_round(128.0f + U_R * rs + U_G * gs + U_B * bs);
    unsigned char v = clamp_round(128.0f + V_R * rs + V_G * gs + V_B * bs);
    size_t plane = (size_t)width * height;
    if (nv12) {
        dst[plane + (size_t)i * 2] = u;
        dst[plane + (size_t)i * 2 + 1] = v;
    } else {
        dst[plane + i] = u;
        dst[plane + (size_t)cw * ch + i] = v;
    }
}

// Regions for detector_input, passed by value (no host-to-device copy per frame).
struct Regions {
    double rect[MAX_REGIONS][3];  // x0, y0, side
    float mean[3];                // per frame channel B, G, R
    float scale[3];               // per frame channel B, G, R
    int count;
    int rgb;                      // != 0: output channels in R, G, B order
};

template <typename T>
__device__ __forceinline__ void store(T* p, float v);
template <>
__device__ __forceinline__ void store<float>(float* p, float v) { *p = v; }
template <>
__device__ __forceinline__ void store<__half>(__half* p, float v) { *p = __float2half_rn(v); }

// out (count, 3, out_h, out_w): the top-left window of each region resized to size x size (a full
// scan feeds only the rows and columns that cover the frame). grid.x covers out_h*out_w pixels,
// grid.y is the region. Value = (bilinear sample - mean) * scale; samples outside the frame are 0.
template <typename T>
__device__ void detector_input_impl(const unsigned char* __restrict__ frame, int width, int height,
                                    const Regions& reg, int size, int out_h, int out_w, T* __restrict__ out) {
    int r = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= reg.count || i >= out_h * out_w) return;
    int row = i / out_w, col = i - row * out_w;
    double x0 = reg.rect[r][0], y0 = reg.rect[r][1], side = reg.rect[r][2];
    double s = side / size;
    double xs = x0 + ((double)col + 0.5) * s - 0.5;
    double ys = y0 + ((double)row + 0.5) * s - 0.5;
    bool valid = xs >= -0.5 && xs <= width - 0.5 && ys >= -0.5 && ys <= height - 0.5;
    double xi = fmin(fmax(xs, 0.0), (double)(width - 1));
    double yi = fmin(fmax(ys, 0.0), (double)(height - 1));
    int xa = (int)floor(xi), ya = (int)floor(yi);
    int xb = min(xa + 1, width - 1), yb = min(ya + 1, height - 1);
    float fx = (float)(xi - xa), fy = (float)(yi - ya);
    size_t plane = (size_t)out_h * out_w;
    T* o = out + (size_t)r * 3 * plane + i;
    const unsigned char* pa = frame + ((size_t)ya * width) * 3;
    const unsigned char* pb = frame + ((size_t)yb * width) * 3;
    for (int c = 0; c < 3; ++c) {
        float top = (float)pa[xa * 3 + c] * (1.0f - fx) + (float)pa[xb * 3 + c] * fx;
        float bot = (float)pb[xa * 3 + c] * (1.0f - fx) + (float)pb[xb * 3 + c] * fx;
        float v = (top * (1.0f - fy) + bot * fy - reg.mean[c]) * reg.scale[c];
        int oc = reg.rgb ? 2 - c : c;
        store<T>(o + oc * plane, valid ? v : 0.0f);
    }
}

extern "C" __global__ void detector_input_f32(const unsigned char* __restrict__ frame, int width, int height,
                                              const Regions reg, int size, int out_h, int out_w,
                                              float* __restrict__ out) {
    detector_input_impl<float>(frame, width, height, reg, size, out_h, out_w, out);
}

extern "C" __global__ void detector_input_f16(const unsigned char* __restrict__ frame, int width, int height,
                                              const Regions reg, int size, int out_h, int out_w,
                                              __half* __restrict__ out) {
    detector_input_impl<__half>(frame, width, height, reg, size, out_h, out_w, out);
}
