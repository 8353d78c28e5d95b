// A tiny RGB drawing surface for charts: filled rectangles, lines and text in a built-in 5x7
// bitmap font (digits, A-Z, lowercase drawn as uppercase, and " .,-+()/:%_"). Drawing outside
// the image is clipped. Thread safety: none; one canvas per thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "afd/bench_client/png_writer.h"

namespace afd::bench_client {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

class Canvas {
 public:
  static constexpr int kGlyphWidth = 5;
  static constexpr int kGlyphHeight = 7;

  Canvas(int width, int height, Rgb background);

  int width() const { return image_.width; }
  int height() const { return image_.height; }
  const RgbImage& image() const { return image_; }

  void FillRect(int x, int y, int w, int h, Rgb color);
  void Line(int x0, int y0, int x1, int y1, Rgb color);  // both ends included
  // Text with its top-left corner at (x, y), each font pixel drawn as scale x scale pixels.
  // Characters without a glyph are drawn as a hollow box.
  void Text(int x, int y, std::string_view text, Rgb color, int scale = 1);
  static int TextWidth(std::string_view text, int scale = 1);

 private:
  void Set(int x, int y, Rgb color);

  RgbImage image_;
};

}  // namespace afd::bench_client
