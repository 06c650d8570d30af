"""``python check_video.py FILE [FRAMES]`` (Linux side of tools/windows-tests): FILE is an H.264
video whose every frame decodes, FRAMES of them when given. Prints what it found; exits 1 if not."""

from __future__ import annotations

import sys

import av


def main() -> int:
    path = sys.argv[1]
    want = int(sys.argv[2]) if len(sys.argv) > 2 else None
    try:
        with av.open(path) as box:
            stream = box.streams.video[0]
            codec, w, h = stream.codec_context.name, stream.codec_context.width, stream.codec_context.height
            frames = sum(1 for _ in box.decode(stream))
    except (OSError, av.error.FFmpegError, IndexError) as exc:
        print(f"{path}: not a playable video ({exc})")
        return 1
    print(f"{path}: {codec} {w}x{h}, {frames} frames")
    return 0 if codec == "h264" and frames > 0 and (want is None or frames == want) else 1


if __name__ == "__main__":
    sys.exit(main())
