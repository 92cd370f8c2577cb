"""LeRobot's feature declarations and the Parquet columns they become.

A feature is declared in `info.json` as `{"dtype", "shape", "names"}`. In the frames' Parquet files:

- `dtype: image` is a struct column `{bytes: binary, path: string}` holding one encoded image
  (PNG here) per frame: the Hugging Face `datasets` Image feature, which LeRobot loads with;
- `dtype: video` has no column: its frames are in the camera's mp4 (`video.py`);
- a numeric dtype of shape (1,) is a plain column of that type; of shape (n,) a fixed-size list of
  n values (`datasets`' `List(..., length=n)`);
- `dtype: string` is a string column.

The files also carry `datasets`' own description of the columns in the schema's `huggingface`
metadata, so that `datasets` (and LeRobot through it) types them without being told.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa

IMAGE, VIDEO, STRING = "image", "video", "string"
CAMERA_DTYPES = (IMAGE, VIDEO)
IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
IMAGE_NAMES = ["height", "width", "channels"]


def arrow_type(feature: dict) -> pa.DataType:
    """The column type a feature is written as (see the module docstring)."""
    dtype = feature["dtype"]
    if dtype == IMAGE:
        return IMAGE_STRUCT
    value = pa.string() if dtype == STRING else pa.from_numpy_dtype(np.dtype(dtype))
    shape = tuple(feature["shape"])
    if shape == (1,):
        return value
    if len(shape) == 1:
        return pa.list_(value, shape[0])
    raise ValueError(f"fleetrl writes scalars, vectors and images; a {dtype} of shape {shape} is none of them")


def huggingface_metadata(features: dict[str, dict]) -> dict[bytes, bytes]:
    """The schema metadata `datasets` writes beside its Parquet files: its type of each column."""
    described = {}
    for key, feature in features.items():
        if feature["dtype"] == VIDEO:
            continue
        if feature["dtype"] == IMAGE:
            described[key] = {"_type": "Image"}
            continue
        value = {"dtype": "string" if feature["dtype"] == STRING else feature["dtype"], "_type": "Value"}
        shape = tuple(feature["shape"])
        described[key] = value if shape == (1,) else {"feature": value, "length": shape[0], "_type": "List"}
    return {b"huggingface": json.dumps({"info": {"features": described}}).encode()}


def encode_png(frame: np.ndarray) -> bytes:
    """One (H, W, 3) uint8 frame as PNG, at the compression LeRobot stores its image features with (6)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(frame).save(out, format="PNG", compress_level=6)
    return out.getvalue()


def decode_image(data: bytes) -> np.ndarray:
    """An encoded image (PNG, JPEG: whatever Pillow opens) → (H, W, 3) uint8 RGB."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def column_values(column: pa.ChunkedArray, feature: dict) -> np.ndarray:
    """A numeric column as (N, *shape) NumPy, whatever list type the writer chose for vectors."""
    array = column.combine_chunks()
    shape = tuple(feature["shape"])
    if pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type) or pa.types.is_large_list(array.type):
        flat = array.flatten()
        while pa.types.is_list(flat.type) or pa.types.is_fixed_size_list(flat.type):
            flat = flat.flatten()
        values = np.array(flat.to_numpy(zero_copy_only=False))  # writable: torch.from_numpy takes it as is
        return values.reshape(len(array), *shape)
    values = np.array(array.to_numpy(zero_copy_only=False))
    return values.reshape(len(array), *shape) if shape != (1,) else values.reshape(len(array), 1)
