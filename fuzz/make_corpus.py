"""Writes the fuzzers' seed corpus (fuzz/corpus/<target>/) and the image the transform-spec
fuzzer decodes (fuzz/transform_spec_image.inc): tiny valid inputs of each kind, under 200 KB
in all. Needs Pillow and numpy, and the stoker command line (STOKER_BIN, default build/stoker)
to pack record shards.

    STOKER_BIN=build/stoker .venv-test/bin/python fuzz/make_corpus.py
"""

import io
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
STOKER = os.environ.get("STOKER_BIN", str(HERE.parent / "build" / "stoker"))


def picture(w, h, seed, mode="RGB"):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / 5 + c) * np.cos(y / 7 - c) for c in range(3)], -1)
    img = np.clip(img + rng.normal(0, 10, img.shape), 0, 255).astype(np.uint8)
    im = Image.fromarray(img)
    return im if mode == "RGB" else im.convert(mode)


def encode(im, fmt, **opts):
    buf = io.BytesIO()
    im.save(buf, fmt, **opts)
    return buf.getvalue()


def jpegs():
    return {
        "baseline_420.jpg": encode(picture(64, 48, 0), "JPEG", quality=70),
        "444.jpg": encode(picture(40, 32, 1), "JPEG", quality=70, subsampling=0),
        "422.jpg": encode(picture(40, 32, 2), "JPEG", quality=70, subsampling=1),
        "progressive.jpg": encode(picture(64, 48, 3), "JPEG", quality=60, progressive=True),
        "gray.jpg": encode(picture(33, 17, 4, "L"), "JPEG", quality=70),
        "cmyk.jpg": encode(picture(24, 24, 5, "CMYK"), "JPEG", quality=70),
        "one_pixel.jpg": encode(picture(1, 1, 6), "JPEG"),
        "wide.jpg": encode(picture(300, 2, 7), "JPEG", quality=50),
        # 200 / 8 = 25 times the val(8, 8) output: decoded at 1/8 (DCT-domain scaling).
        "dct_scaled.jpg": encode(picture(200, 200, 8), "JPEG", quality=30),
        "restart.jpg": encode(picture(48, 48, 9), "JPEG", quality=60, restart_marker_blocks=2),
    }


def pngs():
    rgba = picture(24, 20, 13).convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize((24, 20)))
    gray16 = Image.fromarray((np.arange(20 * 24).reshape(20, 24) * 100).astype(np.uint16))
    return {
        "rgb.png": encode(picture(40, 30, 10), "PNG"),
        "palette.png": encode(picture(32, 24, 11, "P"), "PNG"),
        "gray.png": encode(picture(30, 20, 12, "L"), "PNG"),
        "rgba.png": encode(rgba, "PNG"),
        "gray16.png": encode(gray16, "PNG"),
        "bilevel.png": encode(picture(17, 9, 14, "1"), "PNG"),
        "wide.png": encode(picture(200, 1, 15), "PNG"),
    }


def shards():
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        for cls, items in {"a": ["baseline_420.jpg", "gray.jpg"], "b": ["rgb.png"]}.items():
            (src / cls).mkdir(parents=True)
            for name in items:
                data = jpegs().get(name) or pngs()[name]
                (src / cls / name).write_bytes(data)
        subprocess.run([STOKER, "pack", str(src), str(Path(tmp) / "packed")], check=True,
                       capture_output=True)
        (shard,) = sorted((Path(tmp) / "packed").glob("*.stkr"))
        data = shard.read_bytes()
    return {"three_records.stkr": data, "header_only.stkr": data[:64]}


SPECS = {
    "train.txt": "crop=random_resized size=224 scale=0.08,1 ratio=0.75,1.3333333333333333 flip=1",
    "val.txt": "crop=resize_center resize=256 size=224 flip=0 dtype=float32 layout=chw",
    "uint8_hwc.txt": "crop=resize_center resize=40 size=32 dtype=uint8 layout=hwc exact=1",
    "normalize.txt": "size=16 mean=0.485,0.456,0.406 std=0.229,0.224,0.225 dtype=f32",
    "odd_ratio.txt": "size=8 scale=0.5,0.5 ratio=0.01,100 flip=true exact=false",
    "empty.txt": "",
}


def tars():
    """WebDataset shards: ustar, GNU long names, pax, a directory, cls and npy fields."""
    import tarfile

    out = {}
    npy = io.BytesIO()
    np.save(npy, np.arange(3, dtype=np.float32))
    for name, fmt in {"pax.tar": tarfile.PAX_FORMAT, "gnu.tar": tarfile.GNU_FORMAT,
                      "ustar.tar": tarfile.USTAR_FORMAT}.items():
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
            info = tarfile.TarInfo("d.1")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            long = "x" * 60 + "/" + "y" * 60 if fmt != tarfile.USTAR_FORMAT else "d.1/k"
            for key in ["d.1/k0", long + "1"]:
                for field, data in [("cls", b"3"), ("npy", npy.getvalue())]:
                    info = tarfile.TarInfo(f"{key}.{field}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        # Without tarfile's padding to 10 KiB records: the corpus stays small.
        data = buf.getvalue()
        out[name] = data[:(len(data.rstrip(b"\0")) + 511) // 512 * 512 + 1024]
    return out


def parquets():
    """Parquet files: numbers, a fixed-size list, a binary JPEG column, a Hugging Face image
    struct and strings; uncompressed with page CRCs, and snappy-compressed with dictionaries."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    jpeg = encode(picture(8, 8, 21), "JPEG", quality=50)
    n = 3
    table = pa.table({
        "image": pa.array([jpeg] * n, type=pa.binary()),
        "label": pa.array(range(n), type=pa.int64()),
        "feat": pa.array([[1.0, 2.0]] * n, type=pa.list_(pa.float32(), 2)),
        "hf": pa.array([{"bytes": jpeg, "path": f"{i}.jpg"} for i in range(n)],
                       type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "caption": pa.array(["a", None, "c"]),
    })
    out = {}
    for name, opts in {"plain.parquet": dict(compression="none", write_page_checksum=True,
                                             use_dictionary=False),
                       "snappy.parquet": dict(compression="snappy")}.items():
        buf = io.BytesIO()
        pq.write_table(table, buf, row_group_size=2, write_statistics=False, **opts)
        out[name] = buf.getvalue()
    return out


def videos():
    """Short videos made by FFmpeg's command line (Debian's ffmpeg): H.264 in MP4 with a
    keyframe every 4 frames and B-frames, VP9 in WebM, MPEG-4 part 2 in Matroska, and an MP4
    whose frames come at irregular times (variable frame rate); 32x24, 1-2 s, a few KB each."""
    source = ["-f", "lavfi", "-i", "testsrc=size=32x24:rate=10:duration=1.5"]
    kinds = {
        "h264.mp4": ["-c:v", "libx264", "-g", "4", "-bf", "2", "-pix_fmt", "yuv420p"],
        "vp9.webm": ["-c:v", "libvpx-vp9", "-g", "5", "-deadline", "realtime"],
        "mpeg4.mkv": ["-c:v", "mpeg4", "-g", "6", "-bf", "1"],
        "vfr.mp4": ["-vf", "setpts='N/10/TB+if(gt(N,5),0.3/TB,0)+if(gt(N,9),0.15/TB,0)'",
                    "-fps_mode", "vfr", "-c:v", "libx264", "-g", "5", "-pix_fmt", "yuv420p"],
    }
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in kinds.items():
            path = os.path.join(tmp, name)
            subprocess.run(["ffmpeg", "-v", "error", "-y", *source, *args, "-an",
                            "-map_metadata", "-1", "-fflags", "+bitexact", path], check=True)
            out[name] = Path(path).read_bytes()
    return out


def write(target, files):
    d = HERE / "corpus" / target
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for name, data in files.items():
        (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def main():
    write("jpeg_decode", jpegs())
    write("png_decode", pngs())
    write("records", shards())
    write("transform_spec", SPECS)
    write("tar_index", tars())
    write("parquet_open", parquets())
    write("video_open", videos())
    png = encode(Image.fromarray(np.add.outer(np.arange(24) * 5, np.arange(40) * 3)
                                 .astype(np.uint8)), "PNG")
    lines = [", ".join(f"0x{b:02x}" for b in png[i:i + 16]) + "," for i in range(0, len(png), 16)]
    (HERE / "transform_spec_image.inc").write_text(
        "// Generated by fuzz/make_corpus.py: a 40x24 grayscale PNG.\n" + "\n".join(lines) + "\n")
    total = sum(p.stat().st_size for p in (HERE / "corpus").rglob("*") if p.is_file())
    print(f"corpus: {total} bytes")
    assert total < 200_000


if __name__ == "__main__":
    main()
