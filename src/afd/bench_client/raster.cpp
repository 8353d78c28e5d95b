#include "afd/bench_client/raster.h"

#include <array>
#include <cctype>
#include <cstdlib>
#include <string>

namespace afd::bench_client {

namespace {

// The font: 7 rows of 5 pixels per glyph, '#' set, rows separated by spaces.
struct GlyphArt {
  char c;
  const char* rows;
};
constexpr GlyphArt kFont[] = {
    {'0', ".###. #...# #..## #.#.# ##..# #...# .###."},
    {'1', "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###."},
    {'2', ".###. #...# ....# ...#. ..#.. .#... #####"},
    {'3', "####. ....# ....# .###. ....# ....# ####."},
    {'4', "...#. ..##. .#.#. #..#. ##### ...#. ...#."},
    {'5', "##### #.... ####. ....# ....# #...# .###."},
    {'6', "..##. .#... #.... ####. #...# #...# .###."},
    {'7', "##### ....# ...#. ..#.. .#... .#... .#..."},
    {'8', ".###. #...# #...# .###. #...# #...# .###."},
    {'9', ".###. #...# #...# .#### ....# ...#. .##.."},
    {'A', ".###. #...# #...# ##### #...# #...# #...#"},
    {'B', "####. #...# #...# ####. #...# #...# ####."},
    {'C', ".###. #...# #.... #.... #.... #...# .###."},
    {'D', "####. #...# #...# #...# #...# #...# ####."},
    {'E', "##### #.... #.... ####. #.... #.... #####"},
    {'F', "##### #.... #.... ####. #.... #.... #...."},
    {'G', ".###. #...# #.... #.### #...# #...# .####"},
    {'H', "#...# #...# #...# ##### #...# #...# #...#"},
    {'I', ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###."},
    {'J', "..### ...#. ...#. ...#. ...#. #..#. .##.."},
    {'K', "#...# #..#. #.#.. ##... #.#.. #..#. #...#"},
    {'L', "#.... #.... #.... #.... #.... #.... #####"},
    {'M', "#...# ##.## #.#.# #.#.# #...# #...# #...#"},
    {'N', "#...# #...# ##..# #.#.# #..## #...# #...#"},
    {'O', ".###. #...# #...# #...# #...# #...# .###."},
    {'P', "####. #...# #...# ####. #.... #.... #...."},
    {'Q', ".###. #...# #...# #...# #.#.# #..#. .##.#"},
    {'R', "####. #...# #...# ####. #.#.. #..#. #...#"},
    {'S', ".#### #.... #.... .###. ....# ....# ####."},
    {'T', "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#.."},
    {'U', "#...# #...# #...# #...# #...# #...# .###."},
    {'V', "#...# #...# #...# #...# #...# .#.#. ..#.."},
    {'W', "#...# #...# #...# #.#.# #.#.# #.#.# .#.#."},
    {'X', "#...# #...# .#.#. ..#.. .#.#. #...# #...#"},
    {'Y', "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#.."},
    {'Z', "##### ....# ...#. ..#.. .#... #.... #####"},
    {' ', "..... ..... ..... ..... ..... ..... ....."},
    {'.', "..... ..... ..... ..... ..... .##.. .##.."},
    {',', "..... ..... ..... ..... .##.. ..#.. .#..."},
    {'-', "..... ..... ..... ##### ..... ..... ....."},
    {'+', "..... ..#.. ..#.. ##### ..#.. ..#.. ....."},
    {'(', "...#. ..#.. .#... .#... .#... ..#.. ...#."},
    {')', ".#... ..#.. ...#. ...#. ...#. ..#.. .#..."},
    {'/', "....# ....# ...#. ..#.. .#... #.... #...."},
    {':', "..... .##.. .##.. ..... .##.. .##.. ....."},
    {'%', "##..# ##.#. ...#. ..#.. .#... .#.## #..##"},
    {'_', "..... ..... ..... ..... ..... ..... #####"},
};
constexpr const char* kMissingGlyph = "##### #...# #...# #...# #...# #...# #####";

// Row bit masks (bit 4 = leftmost pixel) per character, built once from kFont.
using Glyph = std::array<uint8_t, Canvas::kGlyphHeight>;

Glyph Parse(const char* rows) {
  Glyph g{};
  int row = 0, col = 0;
  for (const char* p = rows; *p != '\0'; ++p) {
    if (*p == ' ') {
      ++row;
      col = 0;
      continue;
    }
    if (*p == '#') g[row] |= static_cast<uint8_t>(1u << (Canvas::kGlyphWidth - 1 - col));
    ++col;
  }
  return g;
}

const Glyph& GlyphFor(char c) {
  static const auto table = [] {
    std::array<Glyph, 128> t;
    t.fill(Parse(kMissingGlyph));
    for (const GlyphArt& art : kFont) t[static_cast<unsigned char>(art.c)] = Parse(art.rows);
    return t;
  }();
  const auto u = static_cast<unsigned char>(std::toupper(static_cast<unsigned char>(c)));
  return table[u < 128 ? u : 0];
}

}  // namespace

Canvas::Canvas(int width, int height, Rgb background) {
  image_.width = width;
  image_.height = height;
  image_.rgb.resize(size_t(width) * size_t(height) * 3);
  for (size_t i = 0; i < image_.rgb.size(); i += 3) {
    image_.rgb[i] = background.r;
    image_.rgb[i + 1] = background.g;
    image_.rgb[i + 2] = background.b;
  }
}

void Canvas::Set(int x, int y, Rgb color) {
  if (x < 0 || y < 0 || x >= image_.width || y >= image_.height) return;
  uint8_t* p = &image_.rgb[(size_t(y) * size_t(image_.width) + size_t(x)) * 3];
  p[0] = color.r;
  p[1] = color.g;
  p[2] = color.b;
}

void Canvas::FillRect(int x, int y, int w, int h, Rgb color) {
  for (int yy = y; yy < y + h; ++yy) {
    for (int xx = x; xx < x + w; ++xx) Set(xx, yy, color);
  }
}

void Canvas::Line(int x0, int y0, int x1, int y1, Rgb color) {
  // Bresenham, all octants.
  const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
  const int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  while (true) {
    Set(x0, y0, color);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

void Canvas::Text(int x, int y, std::string_view text, Rgb color, int scale) {
  for (const char c : text) {
    const Glyph& g = GlyphFor(c);
    for (int row = 0; row < kGlyphHeight; ++row) {
      for (int col = 0; col < kGlyphWidth; ++col) {
        if (g[row] & (1u << (kGlyphWidth - 1 - col))) {
          FillRect(x + col * scale, y + row * scale, scale, scale, color);
        }
      }
    }
    x += (kGlyphWidth + 1) * scale;
  }
}

int Canvas::TextWidth(std::string_view text, int scale) {
  return text.empty() ? 0 : (static_cast<int>(text.size()) * (kGlyphWidth + 1) - 1) * scale;
}

}  // namespace afd::bench_client
