// Paste-back of every face of a frame in one launch: inverse affine, bilinear sample of the swapped
// crop and of the feathered mask, blend in place, touching only pixels inside each face's paste box.
//
// Twin: vcam/blend.py paste_back. Faces blend in order (a later face wins where boxes overlap), as in
// the NumPy loop: the thread of face f at pixel p writes p only if f is the LAST face whose box holds
// p, and then applies every face g <= f whose box holds p, in order, rounding after each as NumPy
// does. Each pixel is therefore written by exactly one thread and the result does not depend on the
// order blocks run in. Grid: (tiles of the largest box, faces), or fewer tiles striding over it.
// `mask_stride`: 0 when every face shares one (size, size) mask, size*size for one mask per face.

#define MAX_FACES 32

struct Paste {
    double crop_from_frame[MAX_FACES][6];  // row-major (2, 3)
    int box[MAX_FACES][4];                 // x0, y0, x1, y1 (exclusive), clipped to the frame
    int count;
    int box_w;                             // largest box width / height (grid extent)
    int box_h;
};

__device__ __forceinline__ float bilinear(const unsigned char* __restrict__ img, int size, int channels, int c,
                                          double x, double y) {
    x = fmin(fmax(x, 0.0), (double)(size - 1));
    y = fmin(fmax(y, 0.0), (double)(size - 1));
    int x0 = (int)floor(x), y0 = (int)floor(y);
    int x1 = min(x0 + 1, size - 1), y1 = min(y0 + 1, size - 1);
    float fx = (float)(x - x0), fy = (float)(y - y0);
    const unsigned char* r0 = img + (size_t)y0 * size * channels;
    const unsigned char* r1 = img + (size_t)y1 * size * channels;
    float top = (float)r0[x0 * channels + c] * (1.0f - fx) + (float)r0[x1 * channels + c] * fx;
    float bot = (float)r1[x0 * channels + c] * (1.0f - fx) + (float)r1[x1 * channels + c] * fx;
    return top * (1.0f - fy) + bot * fy;
}

__device__ __forceinline__ float bilinear_mask(const float* __restrict__ m, int size, double x, double y) {
    x = fmin(fmax(x, 0.0), (double)(size - 1));
    y = fmin(fmax(y, 0.0), (double)(size - 1));
    int x0 = (int)floor(x), y0 = (int)floor(y);
    int x1 = min(x0 + 1, size - 1), y1 = min(y0 + 1, size - 1);
    float fx = (float)(x - x0), fy = (float)(y - y0);
    float top = m[(size_t)y0 * size + x0] * (1.0f - fx) + m[(size_t)y0 * size + x1] * fx;
    float bot = m[(size_t)y1 * size + x0] * (1.0f - fx) + m[(size_t)y1 * size + x1] * fx;
    return top * (1.0f - fy) + bot * fy;
}

__device__ __forceinline__ bool in_box(const int* b, int x, int y) {
    return x >= b[0] && x < b[2] && y >= b[1] && y < b[3];
}

__device__ void paste_back_impl(unsigned char* __restrict__ frame, int width, int height,
                                const unsigned char* __restrict__ crops, int size, const float* __restrict__ mask,
                                int mask_stride, const Paste& p) {
    int f = blockIdx.y;
    if (f >= p.count) return;
    const int* b = p.box[f];
    int bw = b[2] - b[0], bh = b[3] - b[1];
    if (bw <= 0 || bh <= 0) return;
    int n = p.box_w * p.box_h;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int dy = i / p.box_w, dx = i - dy * p.box_w;
        if (dx >= bw || dy >= bh) continue;
        int x = b[0] + dx, y = b[1] + dy;
        bool owned = true;
        for (int g = f + 1; g < p.count && owned; ++g)
            if (in_box(p.box[g], x, y)) owned = false;  // a later face owns this pixel
        if (!owned) continue;
        unsigned char* px = frame + ((size_t)y * width + x) * 3;
        float val[3] = {(float)px[0], (float)px[1], (float)px[2]};
        for (int g = 0; g <= f; ++g) {
            if (!in_box(p.box[g], x, y)) continue;
            const double* m = p.crop_from_frame[g];
            double u = m[0] * (double)x + m[1] * (double)y + m[2];
            double v = m[3] * (double)x + m[4] * (double)y + m[5];
            bool inside = u >= 0.0 && u <= (double)(size - 1) && v >= 0.0 && v <= (double)(size - 1);
            if (!inside) continue;  // NumPy: a = 0, p = round(p) = p
            float a = bilinear_mask(mask + (size_t)g * mask_stride, size, u, v);
            const unsigned char* crop = crops + (size_t)g * size * size * 3;
            for (int c = 0; c < 3; ++c) {
                float cv = bilinear(crop, size, 3, c, u, v);
                float r = floorf(val[c] * (1.0f - a) + cv * a + 0.5f);
                val[c] = fminf(fmaxf(r, 0.0f), 255.0f);
            }
        }
        px[0] = (unsigned char)val[0];
        px[1] = (unsigned char)val[1];
        px[2] = (unsigned char)val[2];
    }
}

extern "C" __global__ void paste_back(unsigned char* __restrict__ frame, int width, int height,
                                      const unsigned char* __restrict__ crops, int size,
                                      const float* __restrict__ mask, int mask_stride, const Paste p) {
    paste_back_impl(frame, width, height, crops, size, mask, mask_stride, p);
}

// The same, the faces read from a device parameter record (vcam/kernels/records.py) and launched on a
// fixed grid (vcam/kernels/paste.py PASTE_BLOCKS a face, striding over the largest box): a captured
// CUDA graph replays it with the record's address while the boxes change from frame to frame.
extern "C" __global__ void paste_back_rec(unsigned char* __restrict__ frame, int width, int height,
                                          const unsigned char* __restrict__ crops, int size,
                                          const float* __restrict__ mask, int mask_stride,
                                          const Paste* __restrict__ p) {
    paste_back_impl(frame, width, height, crops, size, mask, mask_stride, *p);
}
