"""Where one ``imagenet_train`` sample's CPU goes, and what a crop-aware JPEG decode would save
-> bench/out/crop_decode.json

Single thread, ``time.thread_time`` per image, best of ``--repeats`` passes over ``--images`` of the
ImageNet-like JPEGs of ``bench_imagenet.py`` (~500x375, quality 90, ~100 KB), every image with its
own torchvision RandomResizedCrop(224) box and flip, drawn once from a seeded generator
(``ops.rrc_params``: the server's own draws) so that every candidate decodes the same boxes:

- the stages of the node's native path for one sample (``execute.fill_row``): header + seeded
  draws, JPEG decode (simplejpeg, at the DCT scale ``native.decode_scale`` picks), OpenCV
  resample + flip, and the Python around them; the share that holds the GIL bounds how many
  cores one server process can keep busy (the native calls release it);
- decoders over the same boxes: simplejpeg (accurate and fast DCT), Pillow (full and ``draft``),
  the recipe's Pillow sample (full decode, crop, bilinear resize, flip), PyTurboJPEG's lossless
  crop (``tjTransform`` + ``TJXOPT_CROP``: the only crop the maintained bindings expose) followed by
  a decode of the cropped JPEG, and libjpeg-turbo's own crop-aware decode through its C API
  (``bench/experiments/crop_decode.c``: ``jpeg_skip_scanlines`` above the box, stop after its last row,
  ``jpeg_crop_scanline`` for the columns; compiled here when a C compiler and ``jpeglib.h`` exist).
  No maintained Python binding offers that last one (simplejpeg, PyTurboJPEG 1.x/2.x, OpenCV,
  Pillow, imagecodecs), so it is the reference for what a binding would buy, not an option.

``--turbojpeg-path DIR`` puts DIR first on ``sys.path`` for ``import turbojpeg`` (e.g. a
``pip install --target DIR "PyTurboJPEG<2"`` that works with the system's libturbojpeg 2.x).
"""

from __future__ import annotations

import argparse
import importlib
import io
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
from PIL import Image

from bench.bench_imagenet import make_jpegs
from bench.common import OUT, machine, write_json
from flightfeed.server.transforms import DrawKey, native
from flightfeed.server.transforms.execute import fill_row, prepare_row
from flightfeed.server.transforms.ops import rrc_params

Sample = tuple[bytes, tuple[int, int], tuple[int, int, int, int], bool, int]  # data, full, box, flip, scale
SIZE = 224


def samples(folder: Path, n: int, seed: int) -> tuple[list[Sample], list[Path]]:
    paths = sorted(folder.rglob("*.jpg"))[:n]
    rng = np.random.default_rng(seed)
    out: list[Sample] = []
    for p in paths:
        data = p.read_bytes()
        full = native.jpeg_size(data)
        assert full is not None, p
        left, top, w, h = rrc_params(full[0], full[1], (0.08, 1.0), (3 / 4, 4 / 3), rng)
        box = (left, top, left + w, top + h)
        scale = native.decode_scale(full, (float(left), float(top), float(left + w), float(top + h)), (SIZE, SIZE))
        out.append((data, full, box, bool(rng.random() < 0.5), scale))
    return out, paths


def best_ms(fn: Callable[[Sample], Any], items: Sequence[Sample], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.thread_time()
        for s in items:
            fn(s)
        best = min(best, time.thread_time() - t0)
    return best / len(items) * 1e3


# -- the stages of the node's own path --------------------------------------------------------------
class _Timed:
    """A module stand-in whose named functions add their thread CPU to ``spent``."""

    def __init__(self, module: Any, names: Sequence[str], spent: list[float]) -> None:
        self._module, self._spent = module, spent
        for name in names:
            setattr(self, name, self._wrap(getattr(module, name)))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kw: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kw)
            finally:
                self._spent[0] += time.thread_time() - t0

        return timed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def stages(items: Sequence[Sample], repeats: int) -> dict[str, float]:
    """ms per image of each stage of ``fill_row`` for the ``imagenet_train`` steps (native path)."""
    import pyarrow as pa

    from flightfeed.server.transforms import compile_plan, default_registry
    from flightfeed.wire.messages import WIRE_VERSION, ReadCommand
    from flightfeed.wire.transforms import set_transform

    cmd = ReadCommand(version=WIRE_VERSION, dataset="d", world_size=1, batch_rows=1, streams=1, num_workers=1)
    set_transform(cmd, [{"name": "decode"}, {"name": "random_resized_crop", "size": SIZE}, {"name": "hflip"}])
    plan = compile_plan(pa.schema([pa.field("image", pa.binary())]), cmd, default_registry())
    assert plan is not None
    steps = plan.columns[0].row_steps
    key = DrawKey("bench", 0, 0)
    out = np.empty((SIZE, SIZE, 3), dtype=np.uint8)
    decode, resample = [0.0], [0.0]
    module: Any = native  # its decoder and resampler, swapped for timed stand-ins while measuring
    real_jpeg, real_cv2 = module.simplejpeg, module.cv2
    best: dict[str, float] = {}
    try:
        module.simplejpeg = _Timed(real_jpeg, ["decode_jpeg"], decode)
        module.cv2 = _Timed(real_cv2, ["resize", "warpAffine", "flip"], resample)
        for _ in range(repeats):
            decode[0] = resample[0] = 0.0
            t0 = time.thread_time()
            for row, s in enumerate(items):
                prepare_row(s[0], steps, key, row)
            prep = time.thread_time() - t0
            t0 = time.thread_time()
            for row, s in enumerate(items):
                fill_row(s[0], steps, key, row, out)
            total = time.thread_time() - t0
            n = len(items) / 1e3
            figures = {
                "header_and_draws": prep / n,
                "decode": decode[0] / n,
                "resample_and_flip": resample[0] / n,
                "python_glue": (total - prep - decode[0] - resample[0]) / n,
                "total": total / n,
            }
            if not best or figures["total"] < best["total"]:
                best = figures
    finally:
        module.simplejpeg, module.cv2 = real_jpeg, real_cv2
    held = best["total"] - best["decode"] - best["resample_and_flip"]
    best["holding_gil"] = held
    best["gil_share"] = held / best["total"]
    best["max_cores_one_process"] = best["total"] / held
    return best


# -- decoders over the same boxes --------------------------------------------------------------------
def python_candidates(items: Sequence[Sample], repeats: int) -> dict[str, float]:
    import simplejpeg

    def sj(s: Sample, **kw: Any) -> Any:
        data, full, _, _, k = s
        if k == 1:
            return simplejpeg.decode_jpeg(data, **kw)
        return simplejpeg.decode_jpeg(data, min_width=math.ceil(full[0] / k), min_height=math.ceil(full[1] / k), **kw)

    def pillow_draft(s: Sample) -> None:
        data, full, box, _, _ = s
        img = Image.open(io.BytesIO(data))
        bw, bh = box[2] - box[0], box[3] - box[1]
        img.draft("RGB", (math.ceil(full[0] * SIZE / bw), math.ceil(full[1] * SIZE / bh)))
        img.load()

    def recipe(s: Sample) -> None:  # bench_imagenet's PillowImageFolder sample, minus the file read
        data, _, (x0, y0, x1, y1), flip, _ = s
        img = Image.open(io.BytesIO(data)).convert("RGB").crop((x0, y0, x1, y1))
        img = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        if flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1))

    dst = np.empty((SIZE, SIZE, 3), dtype=np.uint8)

    def node(s: Sample) -> None:
        data, full, box, flip, _ = s
        native.render(data, full, tuple(map(float, box)), dst, flip=flip, interpolation="bilinear", draft=True)  # type: ignore[arg-type]

    return {
        "node_native_sample": best_ms(node, items, repeats),
        "simplejpeg_decode": best_ms(sj, items, repeats),
        "simplejpeg_decode_fastdct_fastupsample": best_ms(
            lambda s: sj(s, fastdct=True, fastupsample=True), items, repeats
        ),
        "pillow_decode": best_ms(lambda s: Image.open(io.BytesIO(s[0])).load(), items, repeats),
        "pillow_draft_decode": best_ms(pillow_draft, items, repeats),
        "recipe_pillow_sample": best_ms(recipe, items, repeats),
    }


def pyturbojpeg(items: Sequence[Sample], repeats: int) -> dict[str, Any]:
    """PyTurboJPEG's lossless crop (MCU-aligned box) + decode of the cropped JPEG, or why not."""
    try:
        turbojpeg: Any = importlib.import_module("turbojpeg")
        tj = turbojpeg.TurboJPEG()
    except Exception as exc:  # not installed, or its libturbojpeg is missing / too old for it
        return {"available": False, "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    mcu_w, mcu_h = [8, 16, 16, 8, 8, 32], [8, 8, 16, 8, 16, 8]

    def aligned(s: Sample) -> tuple[int, int, int, int]:
        _, _, subsample, _ = tj.decode_header(s[0])
        x0, y0, x1, y1 = s[2]
        ax, ay = x0 // mcu_w[subsample] * mcu_w[subsample], y0 // mcu_h[subsample] * mcu_h[subsample]
        return ax, ay, x1 - ax, y1 - ay

    boxes = {id(s): aligned(s) for s in items}
    rgb = turbojpeg.TJPF_RGB
    return {
        "available": True,
        "version": str(getattr(turbojpeg, "__version__", "?")),
        "decode": best_ms(lambda s: tj.decode(s[0], pixel_format=rgb), items, repeats),
        "lossless_crop": best_ms(lambda s: tj.crop(s[0], *boxes[id(s)]), items, repeats),
        "lossless_crop_then_decode": best_ms(
            lambda s: tj.decode(tj.crop(s[0], *boxes[id(s)]), pixel_format=rgb), items, repeats
        ),
    }


def c_reference(items: Sequence[Sample], paths: Sequence[Path], repeats: int) -> dict[str, Any]:
    """bench/experiments/crop_decode.c over the same boxes and DCT scales, or why not."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return {"available": False, "reason": "no C compiler"}
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "crop_decode"
        src = Path(__file__).with_name("crop_decode.c")
        built = subprocess.run([cc, "-O2", "-o", str(exe), str(src), "-ljpeg"], capture_output=True, text=True)
        if built.returncode != 0:
            return {"available": False, "reason": f"build failed: {built.stderr.strip()[:200]}"}
        lines = "".join(
            f"{p} {s[2][0]} {s[2][1]} {s[2][2]} {s[2][3]} {s[4]}\n" for p, s in zip(paths, items, strict=True)
        )
        ran = subprocess.run([str(exe), str(repeats)], input=lines, capture_output=True, text=True, check=True)
    ms = {int(m): float(v) for m, v in (line.split() for line in ran.stdout.splitlines())}
    return {
        "available": True,
        "full_decode": ms[0],
        "rows_only": ms[1],
        "rows_and_columns": ms[2],
        "saved_vs_full": 1 - ms[2] / ms[0],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", type=Path, default=OUT / "imagenet-data" / "1000-images" / "folder",
                   help="bench_imagenet.py's JPEG folder (made here if missing)")
    p.add_argument("--turbojpeg-path", type=Path, default=None)
    args = p.parse_args()
    if not native.AVAILABLE:
        print("simplejpeg / opencv-python-headless are not installed (the `images` extra)", file=sys.stderr)
        return 2
    if args.turbojpeg_path is not None:
        sys.path.insert(0, str(args.turbojpeg_path))
    native.single_threaded()
    folder = make_jpegs(args.data, max(1000, args.images))
    items, paths = samples(folder, args.images, args.seed)
    results: dict[str, Any] = {
        "machine": machine(),
        "images": len(items),
        "mean_kb": float(np.mean([len(s[0]) for s in items]) / 1e3),
        "dct_scales": {str(k): sum(1 for s in items if s[4] == k) for k in (1, 2, 4, 8)},
        "repeats": args.repeats,
        "stages_ms": stages(items, args.repeats),
        "decoders_ms": python_candidates(items, args.repeats),
        "pyturbojpeg_ms": pyturbojpeg(items, args.repeats),
        "libjpeg_crop_aware_ms": c_reference(items, paths, args.repeats),
    }
    path = write_json("crop_decode", results)
    for name in ("stages_ms", "decoders_ms", "pyturbojpeg_ms", "libjpeg_crop_aware_ms"):
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in results[name].items()}
        print(name, shown)
    print("->", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
