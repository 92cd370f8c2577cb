"""LeRobot's dataset format, read and written without LeRobot: the folders robot-learning users keep
their demonstrations in (LeRobotDataset; huggingface/lerobot's `datasets` package).

- `layout`: the folder's paths and `meta/info.json`, for the versions fleetrl reads (v3.0, and
  v2.1, which most published datasets still use) and the one it writes (v3.0);
- `features`: LeRobot's feature declarations (dtype, shape, names) and their Parquet columns;
- `stats`: the per-episode and whole-dataset statistics LeRobot's policies normalise with;
- `writer`: `DatasetWriter`, episodes in, a v3.0 folder out (`fleetrl record`);
- `reader`: a folder in, its frames as arrays (`fleetrl sft`), images and videos decoded;
- `video`: decoding a camera's mp4 with PyAV.

Why not LeRobot itself: its releases pin an older torch than fleetrl's, and its dataset classes
bring the Hugging Face Hub client, `datasets` and torchvision with them; the format is Parquet,
JSON and mp4, which pyarrow, Pillow and PyAV read and write. benchmarks/lerobot/ proves the two
ways against LeRobot's own code: what fleetrl writes loads in `LeRobotDataset`, and what LeRobot
writes (v3.0 and v2.1) trains in `fleetrl sft`.
"""
