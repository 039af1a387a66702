"""Valid but odd images against Pillow (torchvision's PIL loader: Image.open + convert("RGB"),
no EXIF transpose): 1x1, very wide and very tall, EXIF-rotated, progressive CMYK, grayscale
progressive, a PNG named .jpg; and a JPEG missing only its end marker. The bad ones of the
corrupt-data corpus are in tests/corrupt_data_test.cc.

Calls `stoker decode` (STOKER_BIN, default build/stoker).
"""

import subprocess

import pytest
from PIL import Image, ImageFile

from test_pillow import STOKER, crop_reference, decode, mad, photo, val_reference

LIMIT = 2.0  # as in test_pillow.py: mean absolute difference in 8-bit levels


def exif_rotated():
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    return exif


CASES = {  # name: (image, save options)
    "one_pixel.jpg": (lambda: Image.new("RGB", (1, 1), (200, 100, 50)), dict(quality=95)),
    "wide.jpg": (lambda: photo(3000, 4, 1), dict(quality=90)),
    "tall.jpg": (lambda: photo(5, 2500, 2), dict(quality=90)),
    "exif.jpg": (lambda: photo(400, 300, 3), dict(quality=90)),
    "cmyk_progressive.jpg": (lambda: photo(320, 240, 4, "CMYK"),
                             dict(quality=90, progressive=True)),
    "gray_progressive.jpg": (lambda: photo(300, 260, 5, "L"), dict(quality=90, progressive=True)),
    "png_named.jpg": (lambda: photo(300, 200, 6), dict(format="PNG")),
}


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    d = tmp_path_factory.mktemp("odd")
    out = {}
    for name, (make, opts) in CASES.items():
        path = d / name
        img = make()
        if name == "exif.jpg":
            opts = dict(opts, exif=exif_rotated())
        img.save(path, **opts)
        out[name] = path
    return out


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("exact", [False, True])
def test_odd_images_match_pillow(odd, name, exact):
    path = odd[name]
    flags = ["--exact"] if exact else []
    with Image.open(path) as im:
        img = im.convert("RGB")  # what torchvision's pil_loader does
    mine, info = decode(path, "--pipeline", "val", *flags)
    assert (info["width"], info["height"]) == img.size
    assert mad(mine, val_reference(img)) < LIMIT, name
    w, h = img.size
    box = (0, 0, w, h)
    mine, _ = decode(path, "--pipeline", "train", "--crop", *map(str, box), *flags)
    assert mad(mine, crop_reference(img, box)) < LIMIT, name


def test_exif_orientation_is_not_applied_like_torchvision(odd):
    with Image.open(odd["exif.jpg"]) as im:
        assert im.getexif()[0x0112] == 6
        assert im.size == (400, 300)  # Pillow reports the stored size, unrotated
    _, info = decode(odd["exif.jpg"], "--pipeline", "val")
    assert (info["width"], info["height"]) == (400, 300)


def test_a_jpeg_missing_its_end_marker_is_good_for_crops_that_do_not_reach_its_end(tmp_path):
    """The rule for truncated JPEGs (docs/image.md): an error exactly when the rows the crop
    needs run out of data. Pillow, without LOAD_TRUNCATED_IMAGES, refuses the whole file;
    libjpeg reads a little past the last row it decodes, so a crop that reaches the bottom
    runs out of data here too."""
    path = tmp_path / "no_end_marker.jpg"
    photo(320, 400, 7).save(path, quality=90)
    data = path.read_bytes()
    assert data[-2:] == b"\xff\xd9"
    path.write_bytes(data[:-2])
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        with Image.open(path) as im:
            img = im.convert("RGB")
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False
    # val: Resize(256) + CenterCrop(224) needs rows 60 to 340 of 400 (4:2:0 JPEG: decoded in
    # bands of 16 rows, the last one not needed).
    mine, _ = decode(path, "--pipeline", "val")
    assert mad(mine, val_reference(img)) < LIMIT
    top = (0, 0, 320, 200)
    mine, _ = decode(path, "--pipeline", "train", "--crop", *map(str, top))
    assert mad(mine, crop_reference(img, top)) < LIMIT
    r = subprocess.run([STOKER, "decode", str(path), "--pipeline", "train", "--crop", "0", "0",
                        "320", "400"], capture_output=True, text=True)
    assert r.returncode != 0 and str(path) in r.stderr and "truncated JPEG" in r.stderr
