// CIE L*a*b* (sRGB, D65) conversions of face crops and the seamless offset membrane of the classic
// swapper.
//
// Twins: vcam/color.py lab_from_bgr, bgr_from_lab and lab_membrane, same signatures. float32 in the
// NumPy order (built with --fmad=false, so no product is fused into a sum); the transfer curves and
// the cube root in double, rounded once to float, as the references do; the matrix literals are
// exact float32 values, the same as vcam/color.py's.

#define MAX_GRID 32     // membrane cells per side (vcam/color.py MAX_GRID)
#define MEMBRANE_EPS 1e-3f

__device__ __forceinline__ float linear_from_code(unsigned char v) {
    double c = (double)v / 255.0;
    double l = c <= 0.04045 ? c / 12.92 : pow((c + 0.055) / 1.055, 2.4);
    return (float)l;
}

__device__ __forceinline__ float lab_f(float t) {
    return t > 0.00885645207f ? (float)cbrt((double)t) : t * 7.7870369f + 0.137931034f;
}

__device__ __forceinline__ float lab_f_inv(float t) {
    return t > 0.206896558f ? (t * t) * t : (t - 0.137931034f) * 0.12841855f;
}

__device__ __forceinline__ unsigned char code_from_linear(float lin) {
    double d = fmin(fmax((double)lin, 0.0), 1.0);  // fmax(NaN, 0) = 0, as np.fmax
    double e = d <= 0.0031308 ? d * 12.92 : 1.055 * pow(d, 1.0 / 2.4) - 0.055;
    double v = floor(e * 255.0 + 0.5);
    return (unsigned char)fmin(fmax(v, 0.0), 255.0);
}

// crops (count, size, size, 3) uint8 BGR -> out (count, size, size, 3) float32 L, a, b; one thread
// per pixel over all faces (`total` = count * size * size).
extern "C" __global__ void lab_from_bgr(const unsigned char* __restrict__ crops, int total, float* __restrict__ out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const unsigned char* p = crops + (size_t)i * 3;
    float b = linear_from_code(p[0]);
    float g = linear_from_code(p[1]);
    float r = linear_from_code(p[2]);
    float x = (0.433949947f * r + 0.376209766f * g) + 0.189840287f * b;
    float y = (0.212672904f * r + 0.715152204f * g) + 0.0721750036f * b;
    float z = (0.0177565832f * r + 0.109467961f * g) + 0.872775435f * b;
    float fx = lab_f(x), fy = lab_f(y), fz = lab_f(z);
    float* o = out + (size_t)i * 3;
    o[0] = 116.0f * fy - 16.0f;
    o[1] = 500.0f * (fx - fy);
    o[2] = 200.0f * (fy - fz);
}

// lab (count, size, size, 3) float32 -> out uint8 BGR. `affine` != 0: value = lab * scale[f] + shift[f]
// (scale, shift: (count, 3)); `grid` > 0: plus the bilinear upsampling of membrane (count, grid, grid,
// 3). Unused pointers are never read (the caller passes any valid array).
extern "C" __global__ void bgr_from_lab(const float* __restrict__ lab, int count, int size,
                                        const float* __restrict__ scale, const float* __restrict__ shift, int affine,
                                        const float* __restrict__ membrane, int grid,
                                        unsigned char* __restrict__ out) {
    int plane = size * size;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count * plane) return;
    int f = i / plane;
    int k = i - f * plane;
    const float* src = lab + (size_t)i * 3;
    float v[3] = {src[0], src[1], src[2]};
    if (affine) {
        for (int c = 0; c < 3; ++c) v[c] = v[c] * scale[f * 3 + c] + shift[f * 3 + c];
    }
    if (grid > 0) {
        int py = k / size, px = k - py * size;
        float ratio = (float)((double)grid / (double)size);
        float gx = ((float)px + 0.5f) * ratio - 0.5f;
        float gy = ((float)py + 0.5f) * ratio - 0.5f;
        gx = fminf(fmaxf(gx, 0.0f), (float)(grid - 1));
        gy = fminf(fmaxf(gy, 0.0f), (float)(grid - 1));
        int x0 = (int)floorf(gx), y0 = (int)floorf(gy);
        int x1 = min(x0 + 1, grid - 1), y1 = min(y0 + 1, grid - 1);
        float fx = gx - (float)x0, fy = gy - (float)y0;
        const float* m = membrane + (size_t)f * grid * grid * 3;
        const float* m00 = m + ((size_t)y0 * grid + x0) * 3;
        const float* m01 = m + ((size_t)y0 * grid + x1) * 3;
        const float* m10 = m + ((size_t)y1 * grid + x0) * 3;
        const float* m11 = m + ((size_t)y1 * grid + x1) * 3;
        for (int c = 0; c < 3; ++c) {
            float top = m00[c] * (1.0f - fx) + m01[c] * fx;
            float bot = m10[c] * (1.0f - fx) + m11[c] * fx;
            v[c] = v[c] + (top * (1.0f - fy) + bot * fy);
        }
    }
    float ly = (v[0] + 16.0f) / 116.0f;
    float lx = ly + v[1] / 500.0f;
    float lz = ly - v[2] / 200.0f;
    float x = lab_f_inv(lx), y = lab_f_inv(ly), z = lab_f_inv(lz);
    float r = (3.0799551f * x + -1.53713882f * y) + -0.542816103f * z;
    float g = (-0.921258628f * x + 1.87601089f * y) + 0.0452475101f * z;
    float b = (0.0528874025f * x + -0.20402585f * y) + 1.15113842f * z;
    unsigned char* o = out + (size_t)i * 3;
    o[0] = code_from_linear(b);
    o[1] = code_from_linear(g);
    o[2] = code_from_linear(r);
}

// The seamless offset grid out (count, grid, grid, 3): one block per face. Pull: each cell sums
// weight * clip(target - source', -clip, clip) and weight over its pixels (row-major); blur: separable Gaussian over
// the cells (x, then y, k in order) in shared memory; out = sums / (weight sum + 1e-3). source' =
// source * scale[f] + shift[f] when `affine` != 0. `inv_two_sigma2` = 1 / (2 sigma^2), sigma in cells.
extern "C" __global__ void lab_membrane(const float* __restrict__ target, const float* __restrict__ source,
                                        const float* __restrict__ weight, int count, int size,
                                        const float* __restrict__ scale, const float* __restrict__ shift, int affine,
                                        double inv_two_sigma2, float clip, int grid, float* __restrict__ out) {
    __shared__ float pulled[MAX_GRID * MAX_GRID * 4];
    __shared__ float across[MAX_GRID * MAX_GRID * 4];
    __shared__ float g[MAX_GRID];
    int f = blockIdx.x;
    if (f >= count || grid < 1 || grid > MAX_GRID) return;  // uniform per block: no thread waits alone
    int cells = grid * grid;
    for (int k = threadIdx.x; k < grid; k += blockDim.x) g[k] = (float)exp(-(double)(k * k) * inv_two_sigma2);
    float sc[3] = {1.0f, 1.0f, 1.0f}, sh[3] = {0.0f, 0.0f, 0.0f};
    if (affine) {
        for (int c = 0; c < 3; ++c) {
            sc[c] = scale[f * 3 + c];
            sh[c] = shift[f * 3 + c];
        }
    }
    size_t base = (size_t)f * size * size;
    for (int cell = threadIdx.x; cell < cells; cell += blockDim.x) {
        int cy = cell / grid, cx = cell - cy * grid;
        int y0 = cy * size / grid, y1 = (cy + 1) * size / grid;
        int x0 = cx * size / grid, x1 = (cx + 1) * size / grid;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int y = y0; y < y1; ++y) {
            for (int x = x0; x < x1; ++x) {
                size_t p = base + (size_t)y * size + x;
                float w = weight[p];
                if (w == 0.0f) continue;  // adds exactly 0 (inputs are finite)
                const float* t = target + p * 3;
                const float* s = source + p * 3;
                for (int c = 0; c < 3; ++c) {
                    float sv = affine ? s[c] * sc[c] + sh[c] : s[c];
                    float d = fminf(fmaxf(t[c] - sv, -clip), clip);
                    acc[c] = acc[c] + w * d;
                }
                acc[3] = acc[3] + w;
            }
        }
        for (int c = 0; c < 4; ++c) pulled[cell * 4 + c] = acc[c];
    }
    __syncthreads();
    for (int cell = threadIdx.x; cell < cells; cell += blockDim.x) {
        int cy = cell / grid, cx = cell - cy * grid;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k = 0; k < grid; ++k) {
            float gk = g[cx > k ? cx - k : k - cx];
            const float* q = pulled + (cy * grid + k) * 4;
            for (int c = 0; c < 4; ++c) acc[c] = acc[c] + gk * q[c];
        }
        for (int c = 0; c < 4; ++c) across[cell * 4 + c] = acc[c];
    }
    __syncthreads();
    float* o = out + (size_t)f * cells * 3;
    for (int cell = threadIdx.x; cell < cells; cell += blockDim.x) {
        int cy = cell / grid, cx = cell - cy * grid;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k = 0; k < grid; ++k) {
            float gk = g[cy > k ? cy - k : k - cy];
            const float* q = across + (k * grid + cx) * 4;
            for (int c = 0; c < 4; ++c) acc[c] = acc[c] + gk * q[c];
        }
        for (int c = 0; c < 3; ++c) o[cell * 3 + c] = acc[c] / (acc[3] + MEMBRANE_EPS);
    }
}
