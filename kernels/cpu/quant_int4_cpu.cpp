#include <algorithm>
#include <cmath>

#include "kernels/quant_int4.h"

namespace kvscope::kernels {

void quantize_int4(const float* x, int64_t rows, int64_t hd, uint8_t* codes, float* params) {
  const int64_t groups = int4_groups(hd), gs = int4_group_size(hd);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * hd;
    uint8_t* cr = codes + r * (hd / 2);
    float* pr = params + r * groups * 2;
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = xr + g * gs;
      float lo = xg[0], hi = xg[0];
      for (int64_t i = 1; i < gs; ++i) {
        lo = std::min(lo, xg[i]);
        hi = std::max(hi, xg[i]);
      }
      float scale = (hi - lo) / 15.0f;
      float inv = scale > 0 ? 1.0f / scale : 0.0f;
      pr[2 * g] = scale;
      pr[2 * g + 1] = lo;
      for (int64_t i = 0; i < gs; i += 2) {
        int a = static_cast<int>(std::lround((xg[i] - lo) * inv));
        int b = static_cast<int>(std::lround((xg[i + 1] - lo) * inv));
        a = std::clamp(a, 0, 15);
        b = std::clamp(b, 0, 15);
        cr[(g * gs + i) / 2] = static_cast<uint8_t>(a | (b << 4));
      }
    }
  }
}

void dequantize_int4(const uint8_t* codes, const float* params, int64_t rows, int64_t hd,
                     float* x) {
  const int64_t groups = int4_groups(hd), gs = int4_group_size(hd);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* cr = codes + r * (hd / 2);
    const float* pr = params + r * groups * 2;
    float* xr = x + r * hd;
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = pr[2 * g], lo = pr[2 * g + 1];
      for (int64_t i = 0; i < gs; i += 2) {
        uint8_t c = cr[(g * gs + i) / 2];
        xr[g * gs + i] = lo + scale * static_cast<float>(c & 0x0F);
        xr[g * gs + i + 1] = lo + scale * static_cast<float>(c >> 4);
      }
    }
  }
}

}  // namespace kvscope::kernels
