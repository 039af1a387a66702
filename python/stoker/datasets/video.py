"""stoker.VideoClips: clips of video files, decoded in C++ with FFmpeg's libraries."""

from __future__ import annotations

import os
from typing import Sequence, Union

from .. import _stoker
from .native import NativeDataset, object_storage_args

_PathLike = Union[str, "os.PathLike[str]"]


def available() -> bool:
    """Whether this build of stoker has VideoClips (it was built with FFmpeg's libraries)."""
    return hasattr(_stoker, "video_clips")


class VideoClips(NativeDataset):
    """Clips of ``frames`` frames cut from video files, decoded with FFmpeg's libraries in C++
    straight into the batch: samples are ``(clip, label, start_pts)`` with ``clip`` uint8
    ``[frames, 3, H, W]`` RGB, ``label`` int64 and ``start_pts`` float64, the presentation time
    of the clip's first frame in seconds (docs/formats.md, "Video").

    ``paths``: a directory, a video file, or a list of them. A directory holding only folders
    is torchvision's ImageFolder layout (``root/<class>/<video>``: classes sorted, the label the
    class's index); otherwise every video file below it (.mp4 .m4v .mov .mkv .webm .avi) in
    sorted order, labelled by its index among all videos. A ``.tar`` path is a WebDataset
    shard: its video members are read in place, each labelled by its sample's ``.cls`` member
    when it has one. URLs (``s3://`` or ``http(s)://`` video or ``.tar`` objects, or an
    ``s3://`` prefix: every video and ``.tar`` object below it) are read through the object
    cache, ``object_cache`` (a directory; default ``$STOKER_CACHE_DIR/objects``, else
    ``~/.cache/stoker/objects``) up to ``object_cache_bytes``.

    A clip is every ``stride``-th frame from its first or, with ``fps``, the frames on screen
    at ``start + k / fps`` (chosen by presentation timestamps: variable-frame-rate files give
    the right frames). ``clips="uniform"``: ``clips_per_video`` clips evenly spaced over each
    video, the same each epoch; ``"random"``: ``clips_per_video`` clips per video per epoch,
    placed by each sample's seed (so reproducible and independent of workers). Frames are
    resized to ``size`` (an int or ``(height, width)``) with Pillow's antialiased bilinear
    filter; ``crop="center"`` first crops each frame to the output's aspect ratio.

    Every file is indexed once (packets demuxed, nothing decoded), in parallel, at
    construction, and the index cached in ``index_cache`` (a directory; default
    ``$STOKER_CACHE_DIR/video``; False: none). A file the index cannot read raises here,
    naming it and the reason; a clip that does not decode fails its read (``SampleError``, or
    skipped with the DataLoader's ``on_error='skip'``).
    """

    def __init__(self, paths: Union[_PathLike, Sequence[_PathLike]], frames: int = 16,
                 stride: int = 1, size=(224, 224), clips: str = "uniform",
                 clips_per_video: int = 1, fps: float | None = None, crop: str | None = None,
                 index_cache=None, object_cache=None, object_cache_bytes: int = 10 << 30) -> None:
        self._made_with = ((paths,), dict(frames=frames, stride=stride, size=size, clips=clips,
                                          clips_per_video=clips_per_video, fps=fps, crop=crop,
                                          index_cache=index_cache, object_cache=object_cache,
                                          object_cache_bytes=object_cache_bytes))
        if not available():
            raise RuntimeError("stoker.VideoClips: this build of stoker has no video support "
                               "(it was built without FFmpeg's development libraries: "
                               "libavformat-dev libavcodec-dev libavutil-dev libswscale-dev)")
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths_given = [os.fspath(p) for p in paths]
        if isinstance(size, int):
            height = width = size
        else:
            height, width = (int(v) for v in size)
        if crop not in (None, "center"):
            raise ValueError(f"stoker.VideoClips: crop must be None or 'center', not {crop!r}")
        self.frames, self.size = int(frames), (height, width)
        self._names = ("clip", "label", "start_pts")
        self._as_dict = False
        self._handle = _stoker.video_clips(
            self.paths_given, int(frames), int(stride), float(fps or 0.0), height, width,
            crop == "center", str(clips), int(clips_per_video),
            *object_storage_args(index_cache, object_cache, object_cache_bytes))
        self.videos = _stoker.video_paths(self._handle)
        self.labels = _stoker.video_labels(self._handle)
        self.classes = _stoker.video_classes(self._handle)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.clips_per_video = int(clips_per_video)

    def frame_times(self, video: int) -> list:
        """The index of video `video`: its frames' presentation times in seconds, ascending."""
        return _stoker.video_frame_times(self._handle, int(video))

    def keyframes(self, video: int) -> list:
        """Which of video `video`'s frames (in frame_times() order) are keyframes."""
        return _stoker.video_keyframes(self._handle, int(video))

    def clip_frames(self, index: int, seed: int = 0) -> list:
        """The frames (indices into frame_times() of its video) that sample `index` shows when
        read with `seed` (``stoker.sample_seed()`` inside a DataLoader)."""
        return _stoker.video_clip_frames(self._handle, int(index), int(seed))

    def sample_name(self, index: int) -> str:
        """Sample `index` as errors name it: its file and clip number."""
        return self._handle.sample_name(index)

    def counters(self) -> dict:
        """Decode work so far (``decoded_frames``, ``seeks``, ``continued``: reads that went on
        from where a decoder stopped, ``opened``: files opened) and how the indexes were made
        (``indexed``, ``from_cache``)."""
        return _stoker.video_counters(self._handle)
