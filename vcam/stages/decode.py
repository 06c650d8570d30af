"""Decode stage: a camera's MJPG frames to pixels, off the frame loop.

A webcam at 720p or 1080p and 30 fps sends MJPG: one JPEG per frame. Decoding a 1080p JPEG on a
desktop CPU costs about 20 ms, more than the whole GPU pipeline. Sources opened with
``compressed=True`` (:func:`vcam.stages.capture.open_source`) deliver the JPEG as it came (an ``MJPEG``
:class:`~vcam.types.Frame`, a few hundred KB) with ``t_capture`` set on arrival, and the capture
thread runs a decoder on it (:class:`~vcam.stages.capture.CaptureThread`'s ``stage``). So the frame loop
gets pixels, and the latency figures include the decode.

- :class:`CpuJpegDecoder`: OpenCV (libjpeg-turbo) to a BGR host frame; the fallback everywhere.
- :class:`CudaJpegDecoder`: nvJPEG through torchvision's ``decode_jpeg(device="cuda")`` (the GPU's
  hardware JPEG engine where it has one: A100, H100, H200), which gives planar RGB, then one kernel
  (``bgr_from_planar``, whose NumPy twin is :func:`vcam.kernels.convert.to_bgr_ref` with ``RGBP``) to BGR in a
  ring of device buffers (:class:`vcam.ops.cuda.DeviceRing`), on the decoder's own stream. The frame
  handed over holds a ring buffer. The pipeline's upload waits on the device for the buffer's
  ``ready`` event and frees the buffer once its convert has read it. Only the JPEG crosses PCIe.

:func:`open_decoder` picks one from ``[capture] decode`` (``auto``: the GPU when the pipeline runs
on CUDA and nvJPEG works there, else the CPU). A JPEG that does not decode raises
:class:`CorruptFrame`; the capture thread skips it and gives up after many in a row.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np

from vcam.errors import DeviceError, InputError
from vcam.types import Frame, PixelFormat

log = logging.getLogger(__name__)

#: JPEGs in a row that nvJPEG refuses and OpenCV decodes before the GPU decoder gives the camera to the CPU.
FALLBACK_AFTER = 5
#: Device buffers in the GPU decoder's ring: more than the frames the pipeline can hold (its ring,
#: one frame in the capture slot, one being decoded), so a buffer is never written while read.
RING = 8


class CorruptFrame(InputError):
    """One compressed frame did not decode (cameras send a broken JPEG now and then)."""


class JpegDecoder(Protocol):
    """Decodes one ``MJPEG`` frame to a ``BGR`` frame with the same ``seq`` and ``t_capture``."""

    device: str

    def decode(self, frame: Frame) -> Frame: ...


def _jpeg(frame: Frame) -> np.ndarray:
    data = np.asarray(frame.data)
    if data.dtype != np.uint8 or data.size == 0:
        raise CorruptFrame(f"frame {frame.seq} is not a JPEG (empty or not bytes)")
    return data.reshape(-1)


class CpuJpegDecoder:
    """OpenCV's decoder (libjpeg-turbo): a BGR host frame of the JPEG's own size."""

    device = "cpu"

    def __init__(self) -> None:
        import cv2

        self._cv2 = cv2

    def decode(self, frame: Frame) -> Frame:
        img = self._cv2.imdecode(_jpeg(frame), self._cv2.IMREAD_COLOR)
        if img is None:
            raise CorruptFrame(f"frame {frame.seq} is not a decodable JPEG")
        h, w = int(img.shape[0]), int(img.shape[1])
        return Frame(data=img, width=w, height=h, fmt=PixelFormat.BGR, t_capture=frame.t_capture, seq=frame.seq)


class CudaJpegDecoder:
    """nvJPEG (torchvision) into the ops' device ring; see the module docstring. Call
    :meth:`decode` from one thread (the capture thread): the decoder has one stream."""

    device = "cuda"

    def __init__(self, ops: Any, ring: int = RING) -> None:
        if getattr(ops, "device", "cpu") != "cuda":
            raise DeviceError(
                "decoding MJPG on the GPU needs the CUDA pipeline", hint="use --device cuda, or set [capture] decode = 'cpu'"
            )
        try:
            import torch
            from torchvision.io import ImageReadMode, decode_jpeg
        except Exception as exc:  # ImportError, or a torchvision built for another torch
            raise DeviceError(
                f"decoding MJPG on the GPU needs torchvision with nvJPEG ({type(exc).__name__}: {exc})",
                hint="pip install torchvision (the build matching your torch), or set [capture] decode = 'cpu'",
            ) from None
        self.ops = ops
        self._torch = torch
        self._decode_jpeg = decode_jpeg
        self._rgb = ImageReadMode.RGB
        self._count = int(ring)
        self._rings: dict[tuple[int, int], Any] = {}
        cp = ops.xp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._torch_stream = torch.cuda.ExternalStream(self.stream.ptr, device=torch.device("cuda", cp.cuda.Device().id))
        self.decoded = 0
        #: JPEGs nvJPEG refused but OpenCV decoded (some cameras' MJPG, e.g. without Huffman tables);
        #: after :data:`FALLBACK_AFTER` in a row every frame is decoded on the CPU.
        self.fallbacks = 0
        self._refused = 0
        self._opencv = CpuJpegDecoder()
        self._cpu_only = False
        self._check()

    def _check(self) -> None:
        """Decode one small JPEG now: nvJPEG's start-up (its handle, the hardware engine) and any
        failure happen here, not on the first frame."""
        import cv2

        ok, jpeg = cv2.imencode(".jpg", np.full((16, 16, 3), 128, np.uint8))
        if not ok:  # pragma: no cover - OpenCV without a JPEG encoder
            return
        probe = Frame(data=jpeg.reshape(-1), width=16, height=16, fmt=PixelFormat.MJPEG, t_capture=0.0, seq=-1)
        try:
            self._decode_gpu(probe)
        except CorruptFrame as exc:
            raise DeviceError(f"nvJPEG does not work here: {exc}", hint="set [capture] decode = 'cpu'") from None
        self.stream.synchronize()
        self.decoded = 0

    def _ring(self, width: int, height: int) -> Any:
        ring = self._rings.get((width, height))
        if ring is None:
            ring = self._rings[(width, height)] = self.ops.device_ring((height, width, 3), self._count)
        return ring

    def decode(self, frame: Frame) -> Frame:
        """``frame``'s JPEG on the device (BGR); a JPEG nvJPEG refuses is decoded by OpenCV (a host
        frame, uploaded by the pipeline), and a camera whose JPEGs nvJPEG keeps refusing is
        decoded on the CPU from then on (one log line)."""
        if self._cpu_only:
            return self._opencv.decode(frame)
        try:
            out = self._decode_gpu(frame)
        except CorruptFrame:
            out = self._opencv.decode(frame)  # raises CorruptFrame when OpenCV cannot decode it either
            self.fallbacks += 1
            self._refused += 1
            if self._refused >= FALLBACK_AFTER:
                log.warning("nvJPEG cannot decode this camera's JPEGs (OpenCV can): decoding them on the CPU")
                self._cpu_only = True
            return out
        self._refused = 0
        return out

    def _decode_gpu(self, frame: Frame) -> Frame:
        torch = self._torch
        jpeg = _jpeg(frame)
        data = torch.from_numpy(jpeg if jpeg.flags.writeable else jpeg.copy())
        cp = self.ops.xp
        with torch.cuda.stream(self._torch_stream), self.stream:
            try:
                rgb = self._decode_jpeg(data, mode=self._rgb, device="cuda")
            except RuntimeError as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise CorruptFrame(f"frame {frame.seq} is not a decodable JPEG ({reason})") from None
            height, width = int(rgb.shape[1]), int(rgb.shape[2])
            ring = self._ring(width, height)
            i = ring.take()  # waits (rarely) until the pipeline has read the buffer written RING frames ago
            out = ring.buffers[i]
            n = width * height
            self.ops.kernels.launch(
                "convert",
                "bgr_from_planar",
                ((n + 255) // 256,),
                (256,),
                (cp.from_dlpack(rgb), np.int32(width), np.int32(height), np.int32(0), np.int32(height), out),
                self.stream,
            )
            ring.ready[i].record(self.stream)
            # ``rgb`` returns to torch's cache for this stream: a later decode reuses it after the kernel.
            del rgb
        self.decoded += 1
        return Frame(data=out, width=width, height=height, fmt=PixelFormat.BGR, t_capture=frame.t_capture, seq=frame.seq)


def open_decoder(mode: str, ops: Any) -> JpegDecoder:
    """The decoder for ``[capture] decode`` (``auto``, ``gpu`` or ``cpu``) on ``ops``' device.
    ``gpu`` where it cannot work raises :class:`DeviceError` naming the fix; ``auto`` falls back to
    the CPU with one log line."""
    mode = (mode or "auto").lower()
    if mode not in ("auto", "gpu", "cpu"):
        raise InputError(f"unknown [capture] decode {mode!r}", hint="use auto, gpu or cpu")
    if mode == "cpu" or (mode == "auto" and getattr(ops, "device", "cpu") != "cuda"):
        return CpuJpegDecoder()
    try:
        return CudaJpegDecoder(ops)
    except DeviceError as exc:
        if mode == "gpu":
            raise
        log.info("MJPG frames are decoded on the CPU: %s", exc)
        return CpuJpegDecoder()


__all__ = [
    "FALLBACK_AFTER",
    "RING",
    "CorruptFrame",
    "CpuJpegDecoder",
    "CudaJpegDecoder",
    "JpegDecoder",
    "open_decoder",
]
