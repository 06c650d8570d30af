// The classic swap at the frame's resolution: the source face, warped by a dense landmark field and
// colour-mapped, blended straight into the frame (no intermediate crop).
//
// Twins: vcam/kernels/classic.py color_fit_ref, color_fit_crops_ref, tps_nodes_ref and classic_paste_ref. Built with
// --fmad=false, float32 pixels in the NumPy order, coordinates in float64 where the NumPy side uses
// float64 (the crop matrix), float32 elsewhere.

#define GRID 19        // nodes per side of the warp grid (vcam/kernels/classic.py GRID)
#define FIT_SAMPLES 64 // colour samples per source (vcam/kernels/classic.py FIT_SAMPLES)

// ---- colour: the L*a*b* statistics transfer, fitted as one affine map of BGR per face ------------
__device__ double srgb_to_linear(double c) { return c <= 0.04045 ? c / 12.92 : pow((c + 0.055) / 1.055, 2.4); }

__device__ double lab_fd(double t) { return t > 0.008856452070808411 ? cbrt(t) : t * 7.787037037037037 + 4.0 / 29.0; }

__device__ double lab_fi(double t) { return t > 6.0 / 29.0 ? t * t * t : (t - 4.0 / 29.0) * 0.12841854934601665; }

// BGR 0..255 -> L*a*b* (double, the CIE formula with the matrices of vcam/kernels/color.py).
__device__ void lab_of(const double* bgr, double* lab) {
    double b = srgb_to_linear(bgr[0] / 255.0), g = srgb_to_linear(bgr[1] / 255.0), r = srgb_to_linear(bgr[2] / 255.0);
    double x = (0.433949947 * r + 0.376209766 * g) + 0.189840287 * b;
    double y = (0.212672904 * r + 0.715152204 * g) + 0.0721750036 * b;
    double z = (0.0177565832 * r + 0.109467961 * g) + 0.872775435 * b;
    double fx = lab_fd(x), fy = lab_fd(y), fz = lab_fd(z);
    lab[0] = 116.0 * fy - 16.0;
    lab[1] = 500.0 * (fx - fy);
    lab[2] = 200.0 * (fy - fz);
}

// L*a*b* -> BGR 0..255 (double, linear light clamped to [0, 1], no rounding).
__device__ void bgr_of(const double* lab, double* bgr) {
    double fy = (lab[0] + 16.0) / 116.0;
    double fx = fy + lab[1] / 500.0;
    double fz = fy - lab[2] / 200.0;
    double x = lab_fi(fx), y = lab_fi(fy), z = lab_fi(fz);
    const double m[3][3] = {{3.0799551, -1.53713882, -0.542816103},
                            {-0.921258628, 1.87601089, 0.0452475101},
                            {0.0528874025, -0.20402585, 1.15113842}};
    for (int row = 0; row < 3; ++row) {
        double d = (m[row][0] * x + m[row][1] * y) + m[row][2] * z;
        d = fmin(fmax(d, 0.0), 1.0);
        double e = d <= 0.0031308 ? d * 12.92 : 1.055 * pow(d, 1.0 / 2.4) - 0.055;
        bgr[2 - row] = e * 255.0;
    }
}

// The exact transfer (lab - src_mean) / src_std * tgt_std + tgt_mean of one face's FIT_SAMPLES source
// colours, fitted by least squares (ridge 1e-3 on the colour terms) as o = 3 rows (a_b, a_g, a_r,
// offset) for B, G, R. ms, ss, mt, st: that face's 3 statistics each.
__device__ void fit_face(const float* __restrict__ samples, const float* ms, const float* ss, const float* mt,
                         const float* st, float* __restrict__ o) {
    double xtx[4][4] = {{0}}, xty[4][3] = {{0}};
    for (int s = 0; s < FIT_SAMPLES; ++s) {
        const float* p = samples + (size_t)s * 3;
        double x[4] = {(double)p[0], (double)p[1], (double)p[2], 1.0};
        double lab[3], y[3];
        lab_of(x, lab);
        for (int c = 0; c < 3; ++c)
            lab[c] = (lab[c] - (double)ms[c]) / (double)ss[c] * (double)st[c] + (double)mt[c];
        bgr_of(lab, y);
        for (int i = 0; i < 4; ++i) {
            for (int j = 0; j < 4; ++j) xtx[i][j] += x[i] * x[j];
            for (int c = 0; c < 3; ++c) xty[i][c] += x[i] * y[c];
        }
    }
    for (int i = 0; i < 3; ++i) xtx[i][i] += 1e-3 * FIT_SAMPLES;
    // Gauss-Jordan with partial pivoting on [xtx | xty].
    double a[4][7];
    for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) a[i][j] = xtx[i][j];
        for (int c = 0; c < 3; ++c) a[i][4 + c] = xty[i][c];
    }
    for (int col = 0; col < 4; ++col) {
        int piv = col;
        for (int r = col + 1; r < 4; ++r)
            if (fabs(a[r][col]) > fabs(a[piv][col])) piv = r;
        if (piv != col)
            for (int j = 0; j < 7; ++j) {
                double t = a[col][j];
                a[col][j] = a[piv][j];
                a[piv][j] = t;
            }
        double d = a[col][col];
        for (int j = 0; j < 7; ++j) a[col][j] /= d;
        for (int r = 0; r < 4; ++r) {
            if (r == col) continue;
            double k = a[r][col];
            for (int j = 0; j < 7; ++j) a[r][j] -= k * a[col][j];
        }
    }
    for (int c = 0; c < 3; ++c)
        for (int i = 0; i < 4; ++i) o[c * 4 + i] = (float)a[i][4 + c];
}

__device__ __forceinline__ void identity_map(float* o) {
    for (int k = 0; k < 12; ++k) o[k] = (k % 5 == 0) ? 1.0f : 0.0f;
}

// One thread per face: fit_face of face f < count into out[f] (12 floats); `match` == 0: the identity.
extern "C" __global__ void color_fit(const float* __restrict__ samples, const float* __restrict__ src_mean,
                                     const float* __restrict__ src_std, const float* __restrict__ tgt_mean,
                                     const float* __restrict__ tgt_std, int count, int match, float* __restrict__ out) {
    int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= count) return;
    float* o = out + (size_t)f * 12;
    if (!match) {
        identity_map(o);
        return;
    }
    fit_face(samples + (size_t)f * FIT_SAMPLES * 3, src_mean + f * 3, src_std + f * 3, tgt_mean + f * 3, tgt_std + f * 3, o);
}

// ---- the target's statistics and the fit in one launch ---------------------------------------------
// The L*a*b* of one BGR code triple, float32 in the order of vcam/kernels/color.py lab_from_bgr_ref
// (the transfer curve and the cube root in double, rounded once; kernels/color.cu lab_from_bgr).
__device__ __forceinline__ float stats_linear(unsigned char v) {
    double c = (double)v / 255.0;
    return (float)(c <= 0.04045 ? c / 12.92 : pow((c + 0.055) / 1.055, 2.4));
}

__device__ __forceinline__ float stats_f(float t) {
    return t > 0.00885645207f ? (float)cbrt((double)t) : t * 7.7870369f + 0.137931034f;
}

__device__ __forceinline__ void stats_lab(const unsigned char* p, float* lab) {
    float b = stats_linear(p[0]), g = stats_linear(p[1]), r = stats_linear(p[2]);
    float x = (0.433949947f * r + 0.376209766f * g) + 0.189840287f * b;
    float y = (0.212672904f * r + 0.715152204f * g) + 0.0721750036f * b;
    float z = (0.0177565832f * r + 0.109467961f * g) + 0.872775435f * b;
    float fx = stats_f(x), fy = stats_f(y), fz = stats_f(z);
    lab[0] = 116.0f * fy - 16.0f;
    lab[1] = 500.0f * (fx - fy);
    lab[2] = 200.0f * (fy - fz);
}

#define STATS_THREADS 256  // threads per face (vcam/kernels/classic.py STATS_THREADS); a power of two

// Sums red[c][0..STATS_THREADS) into red[c][0] (every thread of the block calls it).
__device__ void block_sum3(double (*red)[STATS_THREADS], int t) {
    __syncthreads();
    for (int k = STATS_THREADS / 2; k > 0; k >>= 1) {
        if (t < k)
            for (int c = 0; c < 3; ++c) red[c][t] += red[c][t + k];
        __syncthreads();
    }
}

// One block of STATS_THREADS per face f < count: the weighted L*a*b* mean and spread of its target
// crop (crops (count, size, size, 3) uint8 BGR; weight (size, size) float32 summing to wsum) as
// vcam/stages/swap.py _weighted_stats computes them (mean = sum(lab * w) / wsum; std =
// sqrt(sum((lab - mean)^2 * w) / wsum) + 1e-3; float32 terms, summed in double here), then fit_face
// with the source's statistics into out[f]. `match` == 0: the identity, no statistics.
extern "C" __global__ void color_fit_crops(const unsigned char* __restrict__ crops, int size,
                                           const float* __restrict__ weight, float wsum,
                                           const float* __restrict__ samples, const float* __restrict__ src_mean,
                                           const float* __restrict__ src_std, int count, int match,
                                           float* __restrict__ out) {
    __shared__ double red[3][STATS_THREADS];
    __shared__ float stat[6];  // target mean (3), std (3)
    int f = blockIdx.x;
    if (f >= count) return;  // uniform per block: before any barrier
    int t = threadIdx.x;
    float* o = out + (size_t)f * 12;
    if (!match) {
        if (t == 0) identity_map(o);
        return;
    }
    int plane = size * size;
    const unsigned char* crop = crops + (size_t)f * plane * 3;
    double s[3] = {0.0, 0.0, 0.0};
    for (int i = t; i < plane; i += STATS_THREADS) {
        float lab[3];
        stats_lab(crop + (size_t)i * 3, lab);
        float w = weight[i];
        for (int c = 0; c < 3; ++c) s[c] += (double)(lab[c] * w);
    }
    for (int c = 0; c < 3; ++c) red[c][t] = s[c];
    block_sum3(red, t);
    if (t == 0)
        for (int c = 0; c < 3; ++c) stat[c] = (float)red[c][0] / wsum;
    __syncthreads();
    float mean[3] = {stat[0], stat[1], stat[2]};
    for (int c = 0; c < 3; ++c) s[c] = 0.0;
    for (int i = t; i < plane; i += STATS_THREADS) {
        float lab[3];
        stats_lab(crop + (size_t)i * 3, lab);
        float w = weight[i];
        for (int c = 0; c < 3; ++c) {
            float d = lab[c] - mean[c];
            s[c] += (double)((d * d) * w);
        }
    }
    for (int c = 0; c < 3; ++c) red[c][t] = s[c];
    block_sum3(red, t);
    if (t == 0) {
        for (int c = 0; c < 3; ++c) stat[3 + c] = sqrtf((float)red[c][0] / wsum) + 1e-3f;
        fit_face(samples + (size_t)f * FIT_SAMPLES * 3, src_mean + f * 3, src_std + f * 3, stat, stat + 3, o);
    }
}

// ---- the render -----------------------------------------------------------------------------------
// ---- the warp grid: a thin-plate spline evaluated at the grid's nodes --------------------------------
#define TPS_MAX 48  // control points of a spline, at most (vcam/kernels/classic.py TPS_MAX)

struct Spline {              // vcam/kernels/classic.py SPLINE, in the spline's unit coordinates
    float q[TPS_MAX][2];     // control points (the first n)
    float w[TPS_MAX][2];     // their weights
    float a[3][2];           // affine part: constant, x, y rows
    double g0[2];            // node (0, 0)
    double step;             // between nodes
    int n;
};

// One thread per node (GRID * GRID) of one face: grid[(r * GRID + c) * 2 + k] = the spline at
// (g0[0] + c * step, g0[1] + r * step), twin of tps_nodes_ref (float32 terms, summed in double).
extern "C" __global__ void tps_nodes(const Spline s, float* __restrict__ grid) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= GRID * GRID) return;
    int r = i / GRID, c = i - r * GRID;
    float x = (float)(s.g0[0] + (double)c * s.step);
    float y = (float)(s.g0[1] + (double)r * s.step);
    double sx = 0.0, sy = 0.0;
    for (int j = 0; j < s.n; ++j) {
        float dx = x - s.q[j][0], dy = y - s.q[j][1];
        float d2 = fmaxf(dy * dy + dx * dx, 1e-30f);
        float k = d2 * logf(d2);
        sx += (double)(k * s.w[j][0]);
        sy += (double)(k * s.w[j][1]);
    }
    grid[i * 2] = (((float)sx + s.a[0][0]) + x * s.a[1][0]) + y * s.a[2][0];
    grid[i * 2 + 1] = (((float)sy + s.a[0][1]) + x * s.a[1][1]) + y * s.a[2][1];
}

struct Render {
    double crop_from_frame[6];  // row-major (2, 3): frame pixel centre -> crop pixel centre
    int box[4];                 // x0, y0, x1, y1 (exclusive), clipped to the frame
    float grid_origin[2];       // crop point of grid node (0, 0)
    float grid_inv;             // grid nodes per crop pixel
    int size;                   // crop size (the mask's side)
    int offset_size;            // side of the colour offset grid (0: none)
};

// The colour offset (B, G, R) at crop point (x, y) of an (og, og, 3) float32 grid over the crop (grid
// cell centres at crop (i + 0.5) * size / og - 0.5; bilinear, edges clamped), into o.
__device__ __forceinline__ void offset_at(const float* __restrict__ g, int og, int size, double x, double y, float* o) {
    float k = (float)og / (float)size;
    float gx = fminf(fmaxf(((float)x + 0.5f) * k - 0.5f, 0.0f), (float)(og - 1));
    float gy = fminf(fmaxf(((float)y + 0.5f) * k - 0.5f, 0.0f), (float)(og - 1));
    int x0 = (int)floorf(gx), y0 = (int)floorf(gy);
    int x1 = min(x0 + 1, og - 1), y1 = min(y0 + 1, og - 1);
    float fx = gx - (float)x0, fy = gy - (float)y0;
    for (int c = 0; c < 3; ++c) {
        float top = g[((size_t)y0 * og + x0) * 3 + c] * (1.0f - fx) + g[((size_t)y0 * og + x1) * 3 + c] * fx;
        float bot = g[((size_t)y1 * og + x0) * 3 + c] * (1.0f - fx) + g[((size_t)y1 * og + x1) * 3 + c] * fx;
        o[c] = top * (1.0f - fy) + bot * fy;
    }
}

__device__ __forceinline__ float mask_at(const float* __restrict__ m, int size, double x, double y) {
    x = fmin(fmax(x, 0.0), (double)(size - 1));
    y = fmin(fmax(y, 0.0), (double)(size - 1));
    int x0 = (int)floor(x), y0 = (int)floor(y);
    int x1 = min(x0 + 1, size - 1), y1 = min(y0 + 1, size - 1);
    float fx = (float)(x - x0), fy = (float)(y - y0);
    float top = m[(size_t)y0 * size + x0] * (1.0f - fx) + m[(size_t)y0 * size + x1] * fx;
    float bot = m[(size_t)y1 * size + x0] * (1.0f - fx) + m[(size_t)y1 * size + x1] * fx;
    return top * (1.0f - fy) + bot * fy;
}

// frame (height, width, 3) uint8 in place; source (sh, sw, 4) uint8 B, G, R, face weight (255: 1); mask
// (size, size) float32 of this face; affine (12,) float32 of this face; grid (GRID, GRID, 2) float32
// source (x, y) of every node, row-major (tps_nodes); offset (og, og, 3) float32 of this face added to
// the mapped colour (p.offset_size = og; 0: not read). One thread per box pixel.
extern "C" __global__ void classic_paste(unsigned char* __restrict__ frame, int width, int height,
                                         const unsigned char* __restrict__ source, int sw, int sh,
                                         const float* __restrict__ mask, const float* __restrict__ affine,
                                         const float* __restrict__ grid, const float* __restrict__ offset,
                                         const Render p) {
    int bw = p.box[2] - p.box[0], bh = p.box[3] - p.box[1];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (bw <= 0 || bh <= 0 || i >= bw * bh) return;
    int dy = i / bw, dx = i - dy * bw;
    int x = p.box[0] + dx, y = p.box[1] + dy;
    const double* m = p.crop_from_frame;
    double u = m[0] * (double)x + m[1] * (double)y + m[2];
    double v = m[3] * (double)x + m[4] * (double)y + m[5];
    int s1 = p.size - 1;
    if (!(u >= 0.0 && u <= (double)s1 && v >= 0.0 && v <= (double)s1)) return;
    float a = mask_at(mask, p.size, u, v);
    if (!(a > 0.0f)) return;
    // warp grid: crop point -> source point (bilinear between nodes, replicate border)
    float gx = ((float)u - p.grid_origin[0]) * p.grid_inv;
    float gy = ((float)v - p.grid_origin[1]) * p.grid_inv;
    gx = fminf(fmaxf(gx, 0.0f), (float)(GRID - 1));
    gy = fminf(fmaxf(gy, 0.0f), (float)(GRID - 1));
    int gx0 = (int)floorf(gx), gy0 = (int)floorf(gy);
    int gx1 = min(gx0 + 1, GRID - 1), gy1 = min(gy0 + 1, GRID - 1);
    float tx = gx - (float)gx0, ty = gy - (float)gy0;
    float src[2];
    for (int c = 0; c < 2; ++c) {
        float top = grid[(gy0 * GRID + gx0) * 2 + c] * (1.0f - tx) + grid[(gy0 * GRID + gx1) * 2 + c] * tx;
        float bot = grid[(gy1 * GRID + gx0) * 2 + c] * (1.0f - tx) + grid[(gy1 * GRID + gx1) * 2 + c] * tx;
        src[c] = top * (1.0f - ty) + bot * ty;
    }
    // source sample (bilinear, replicate border), 4 channels
    float sx = fminf(fmaxf(src[0], 0.0f), (float)(sw - 1));
    float sy = fminf(fmaxf(src[1], 0.0f), (float)(sh - 1));
    int x0 = (int)floorf(sx), y0 = (int)floorf(sy);
    int x1 = min(x0 + 1, sw - 1), y1 = min(y0 + 1, sh - 1);
    float fx = sx - (float)x0, fy = sy - (float)y0;
    const unsigned char* r0 = source + (size_t)y0 * sw * 4;
    const unsigned char* r1 = source + (size_t)y1 * sw * 4;
    float s[4];
    for (int c = 0; c < 4; ++c) {
        float top = (float)r0[x0 * 4 + c] * (1.0f - fx) + (float)r0[x1 * 4 + c] * fx;
        float bot = (float)r1[x0 * 4 + c] * (1.0f - fx) + (float)r1[x1 * 4 + c] * fx;
        s[c] = top * (1.0f - fy) + bot * fy;
    }
    a = a * (s[3] * (1.0f / 255.0f));
    if (!(a > 0.0f)) return;
    float off[3] = {0.0f, 0.0f, 0.0f};
    if (p.offset_size > 0) offset_at(offset, p.offset_size, p.size, u, v, off);
    unsigned char* px = frame + ((size_t)y * width + x) * 3;
    for (int c = 0; c < 3; ++c) {
        const float* row = affine + c * 4;
        float col = (((row[0] * s[0] + row[1] * s[1]) + row[2] * s[2]) + row[3]) + off[c];
        float r = floorf((float)px[c] * (1.0f - a) + col * a + 0.5f);
        px[c] = (unsigned char)fminf(fmaxf(r, 0.0f), 255.0f);
    }
}
