/* The crop-aware JPEG decode that no maintained Python binding exposes, measured as a reference
 * for bench/experiments/bench_crop_decode.py (which compiles it: `cc -O2 crop_decode.c -ljpeg`).
 *
 * libjpeg-turbo's libjpeg API (>= 1.5, so Debian's 2.1.5 has it): decode at a DCT scale, then
 *   mode 0: every row, every column (what simplejpeg does);
 *   mode 1: jpeg_skip_scanlines() over the rows above the box (entropy-decoded, no IDCT/colour
 *           conversion) and stop after the box's last row (the rows below are never entropy-decoded);
 *   mode 2: mode 1 plus jpeg_crop_scanline() (IDCT/upsampling/colour conversion only for the
 *           iMCU columns the box covers).
 * Input (stdin): lines "path x0 y0 x1 y1 scale" (box in full-size pixels). Output (stdout): one
 * line per mode, "mode ms_per_image", the best of `repeats` passes of thread CPU time.
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <jpeglib.h>

#define MAX_IMAGES 4096

struct error_mgr {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
};

static void on_error(j_common_ptr cinfo) { longjmp(((struct error_mgr *)cinfo->err)->jump, 1); }

static double thread_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static unsigned char *pixels;

static int decode(const unsigned char *data, unsigned long size, const int *box, int mode) {
  struct jpeg_decompress_struct cinfo;
  struct error_mgr err;
  int scale = box[4];
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, size);
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = (unsigned int)scale;
  jpeg_start_decompress(&cinfo);
  JDIMENSION width = cinfo.output_width, height = cinfo.output_height, top = 0, bottom = height;
  if (mode > 0) {
    top = (JDIMENSION)(box[1] / scale);
    bottom = (JDIMENSION)((box[3] + scale - 1) / scale);
    if (bottom > height) bottom = height;
  }
  if (mode == 2) {
    JDIMENSION x = (JDIMENSION)(box[0] / scale), w = (JDIMENSION)((box[2] + scale - 1) / scale) - x;
    if (x + w > width) w = width - x;
    jpeg_crop_scanline(&cinfo, &x, &w);
  }
  if (top > 0) jpeg_skip_scanlines(&cinfo, top);
  while (cinfo.output_scanline < bottom) {
    JSAMPROW row = pixels + (size_t)cinfo.output_scanline * width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  if (cinfo.output_scanline < height)
    jpeg_abort_decompress(&cinfo);
  else
    jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return 0;
}

int main(int argc, char **argv) {
  static unsigned char *data[MAX_IMAGES];
  static unsigned long sizes[MAX_IMAGES];
  static int boxes[MAX_IMAGES][5];
  char path[4096];
  int n = 0, repeats = argc > 1 ? atoi(argv[1]) : 5;
  while (n < MAX_IMAGES && scanf("%4095s %d %d %d %d %d", path, &boxes[n][0], &boxes[n][1], &boxes[n][2],
                                 &boxes[n][3], &boxes[n][4]) == 6) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return 2;
    fseek(f, 0, SEEK_END);
    sizes[n] = (unsigned long)ftell(f);
    fseek(f, 0, SEEK_SET);
    data[n] = malloc(sizes[n]);
    if (fread(data[n], 1, sizes[n], f) != sizes[n]) return 2;
    fclose(f);
    n++;
  }
  if (n == 0) return 2;
  pixels = malloc((size_t)8192 * 8192 * 3);
  for (int mode = 0; mode < 3; mode++) {
    double best = 1e9;
    for (int r = 0; r < repeats; r++) {
      double t0 = thread_seconds();
      for (int i = 0; i < n; i++)
        if (decode(data[i], sizes[i], boxes[i], mode) != 0) return 3;
      double t = thread_seconds() - t0;
      if (t < best) best = t;
    }
    printf("%d %.6f\n", mode, best / n * 1e3);
  }
  return 0;
}
