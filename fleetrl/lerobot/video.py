"""A camera's frames from an mp4 of a LeRobotDataset, decoded with PyAV (FFmpeg's libraries, with
the AV1, H.264 and HEVC decoders LeRobot's encoders need: AV1 is LeRobot's default).

A frame of the dataset is asked for by its time in the file (its episode's start in the file plus
its own timestamp) and answered with the decoded frame nearest that time, which must lie within
`tolerance_s` of it — LeRobot's own rule (its `tolerance_s`, 1e-4 s by default), so a video that
lost or shifted frames is an error, not a silently wrong picture.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TOLERANCE_S = 1e-4


class FrameTimeError(ValueError):
    """No frame of the video lies within the tolerance of a requested time."""


def decode_at(path: Path, times: np.ndarray, tolerance_s: float = TOLERANCE_S) -> np.ndarray:
    """The frames of the video at `path` nearest each of `times` (seconds), as (len(times), H, W, 3)
    uint8 RGB, in the order of `times`. One pass over the file, holding only the frames kept."""
    import av

    order = np.argsort(times, kind="stable")
    chosen: list = [None] * len(times)
    chosen_time = np.full(len(times), np.nan)
    pending = 0  # requests before this one (in time order) have their frame
    previous = None  # (time, frame) of the last decoded frame
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            if frame.time is None:
                raise FrameTimeError(f"{path}: a frame without a presentation time")
            now = float(frame.time)
            while pending < len(order) and times[order[pending]] <= now:
                request = order[pending]
                nearer_previous = previous is not None and times[request] - previous[0] < now - times[request]
                chosen_time[request], picture = previous if nearer_previous else (now, frame)
                chosen[request] = picture.to_ndarray(format="rgb24")
                pending += 1
            previous = (now, frame)
            if pending == len(order):
                break
        for request in order[pending:]:  # after the last frame: the last frame, if near enough
            if previous is not None:
                chosen_time[request], chosen[request] = previous[0], previous[1].to_ndarray(format="rgb24")
    off = np.flatnonzero(~(np.abs(chosen_time - times) <= tolerance_s))
    if len(off):
        first = off[0]
        raise FrameTimeError(
            f"{path}: no frame within {tolerance_s} s of {times[first]:.6f} s (nearest: {chosen_time[first]:.6f} s; "
            f"{len(off)} of {len(times)} requested frames are off)"
        )
    return np.stack(chosen)
