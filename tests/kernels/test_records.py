"""Parameter records (vcam/kernels/records.py): a frame's per-launch structs in one host block and its
device twin, read by the kernels' ``_rec`` twins through a pointer (the groundwork of a per-frame
CUDA graph, issue 43). The block's bookkeeping and the launch rewrite run everywhere; the ``_rec``
kernels against the NumPy references run on CUDA, frame after frame with the faces moving and the
records reused (the test a graph replay needs: the same addresses, new bytes)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host, poisoned

from vcam import align
from vcam.kernels import mask as kmask
from vcam.kernels import paste as blend
from vcam.kernels import records, warp
from vcam.kernels.build import launch


def _record(nbytes=records.RECORD_BYTES):
    return records.ParamRecord.in_host_memory(nbytes)


def test_structs_land_aligned_in_order_and_a_cleared_record_starts_again():
    rec = _record()
    a = np.zeros(1, dtype=blend.PASTE)
    a["count"][0] = 3
    host_a, dev_a = rec.put(a)
    b = np.zeros(1, dtype=np.dtype([("x", "i4")]))
    b["x"][0] = 7
    host_b, dev_b = rec.put(b)
    c = np.zeros(1, dtype=warp.FACES)
    host_c, _ = rec.put(c)
    offsets = [int(h.__array_interface__["data"][0] - rec.host.__array_interface__["data"][0]) for h in (host_a, host_b, host_c)]
    assert offsets[0] == 0
    assert offsets[1] == -(-blend.PASTE.itemsize // records.ALIGN) * records.ALIGN
    assert offsets[2] % records.ALIGN == 0 and offsets[2] >= offsets[1] + 4
    assert host_a.tobytes() == a.tobytes() and host_b.tobytes() == b.tobytes()
    assert dev_a.shape == host_a.shape and dev_b.shape == host_b.shape
    rec.clear()
    assert rec.used == 0 and rec.signature == []
    again, _ = rec.put(b)
    assert again.__array_interface__["data"][0] == rec.host.__array_interface__["data"][0]


def test_a_frame_that_does_not_fit_is_refused():
    rec = _record(256)
    rec.put(np.zeros(1, dtype=np.dtype([("x", "f8", (20,))])))  # 160 bytes
    with pytest.raises(records.RecordFull, match="more than 256 bytes"):
        rec.put(np.zeros(1, dtype=np.dtype([("x", "f8", (20,))])))


def test_blocks_of_two_lengths_are_refused():
    with pytest.raises(ValueError, match="one length"):
        records.ParamRecord(np.zeros(64, np.uint8), np.zeros(32, np.uint8))


class _Kernels:
    def __init__(self):
        self.calls = []
        self.cache = {}

    def launch(self, module, kernel, grid, block, args, stream=None):
        self.calls.append((module, kernel, grid, args))


class _Ops:
    """What :func:`launch` asks of the ops: their kernels, stream and the parameter copies."""

    device = "cuda"

    xp = np

    def __init__(self):
        self.kernels, self.stream, self.copies, self.params = _Kernels(), "compute", [], None

    def put_params(self, device, host_bytes):
        np.copyto(device, host_bytes)
        self.copies.append((device.__array_interface__["data"][0], host_bytes.nbytes, self.stream))

    def record(self, event):
        event.recorded += 1


def test_under_a_record_an_opted_in_launch_reads_its_struct_through_the_record():
    ops = _Ops()
    struct = np.zeros(1, dtype=blend.PASTE)
    struct["box_w"][0] = 40
    frame = np.zeros((8, 8, 3), np.uint8)
    launch(ops, "paste", "paste_back", (9, 1), (frame, np.int32(8), struct), fixed=(128, 1))
    assert ops.kernels.calls[-1][1:3] == ("paste_back", (9, 1)) and ops.kernels.calls[-1][3][2] is struct  # no record: by value
    rec = _record()
    with records.recording(ops, rec):
        launch(ops, "paste", "paste_back", (9, 1), (frame, np.int32(8), struct), fixed=(128, 1))
        launch(ops, "convert", "bgr_to_420", (5,), (frame, struct))  # not opted in: by value
    assert ops.params is None  # the record is let go on the way out
    module, kernel, grid, args = ops.kernels.calls[-2]
    assert (module, kernel, grid) == ("paste", "paste_back_rec", (128, 1))
    assert args[0] is frame and args[1] == 8
    assert args[2].dtype == np.uint8 and args[2].tobytes() == struct.tobytes()  # the device bytes
    assert ops.copies == [(args[2].__array_interface__["data"][0], blend.PASTE.itemsize, "compute")]
    assert ops.kernels.calls[-1][1] == "bgr_to_420" and ops.kernels.calls[-1][3][1] is struct
    assert rec.signature == [("paste", "paste_back_rec", (128, 1), blend.PASTE.itemsize)]


def _face_fronts(ops, mats, lms, n, size=128):
    """The swap part's recorded fronts, as the pipeline calls them (their CUDA branches, on host arrays)."""
    frame = np.zeros((359, 641, 3), np.uint8)
    warp.warp_crops_normalized(
        ops, frame, mats, size, (127.5,) * 3, (127.5,) * 3, True, out=np.zeros((n, 3, size, size), np.float16)
    )
    kmask.landmark_masks(ops, lms, n, blend.box_mask(size), np.zeros((n, size, size), np.float32))
    blend.paste_back(ops, frame, np.zeros((n, size, size, 3), np.uint8), mats, np.zeros((size, size), np.float32), n)


def test_packing_a_frame_writes_its_structs_where_the_captured_frame_did_and_launches_nothing():
    """A replayed frame's host side (``PackOnly``): the fronts of a frame with other faces write their
    structs at the offsets of the frame that was captured (equal signatures), queue no copy and
    launch nothing; the bytes are the new faces' (what the replay's captured copies then move)."""
    rng = np.random.default_rng(3)
    ops, rec = _Ops(), _record()
    n = 2
    mats0 = np.stack(
        [align.estimate((align.TEMPLATES["arcface_128"] - 0.5) * 150 + c, "arcface_128", 128) for c in ([200, 180], [420, 200])]
    )
    lms = (align.TEMPLATES["arcface_128"][None] * 128 + rng.normal(0, 2, (n, 5, 2))).astype(np.float32)
    with records.recording(ops, rec):
        _face_fronts(ops, mats0, lms, n)
    captured, launched, copied = list(rec.signature), len(ops.kernels.calls), len(ops.copies)
    assert [s[1] for s in captured] == ["warp_crops_norm_f16_rec", "landmark_masks_rec", "paste_back_rec"]
    assert launched == 3 and copied == 3
    first = rec.host[: rec.used].copy()
    packer = records.PackOnly(ops)
    assert packer.xp is np and packer.stream == "compute"  # everything else is the real ops'
    mats1 = mats0.copy()
    mats1[:, :, 2] += [7.0, -5.0]  # the faces moved
    rec.clear()
    with records.recording(packer, rec):
        _face_fronts(packer, mats1, lms + 1.5, n)
    assert rec.signature == captured
    assert len(ops.kernels.calls) == launched and len(ops.copies) == copied  # nothing launched, nothing copied
    assert not np.array_equal(rec.host[: rec.used], first)
    paste_at = captured[2][3] - blend.PASTE.itemsize  # the paste's struct: the last one written
    struct = rec.host[paste_at : captured[2][3]].view(blend.PASTE)[0]
    np.testing.assert_array_equal(struct["box"][:n], blend.paste_boxes(mats1, 128, 359, 641))
    assert ops.params is None and packer.params is None


def test_a_record_in_use_waits_for_the_device_before_it_is_written_again():
    class Event:
        recorded = waited = 0

        def synchronize(self):
            self.waited += 1

    done = Event()
    rec = records.ParamRecord(np.zeros(64, np.uint8), np.zeros(64, np.uint8), done)
    rec.clear()
    assert done.waited == 0  # never used: nothing to wait for
    rec.close(_Ops())
    assert done.recorded == 1
    rec.clear()
    assert done.waited == 1
    rec.clear()
    assert done.waited == 1  # not closed since: no wait


# -- the _rec kernels on the GPU, frame after frame -------------------------------------------------
def _cuda_only(ops):
    if ops.device == "cpu":
        pytest.skip("the _rec kernels are CUDA's: the NumPy references have no parameter record")


def _mats(rng, n, w, h, size):
    mats = []
    for _ in range(n):
        side = rng.uniform(40, 0.6 * min(w, h))
        cx, cy = rng.uniform(0.2 * w, 0.8 * w), rng.uniform(0.2 * h, 0.8 * h)
        lm = (align.TEMPLATES["arcface_128"] - 0.5) * side + [cx, cy]
        mats.append(align.estimate(lm, "arcface_128", size))
    return np.array(mats)


def test_the_record_kernels_equal_the_references_frame_after_frame(ops):
    """Three frames through two records (a ring slot's each), the faces moved every frame: the warp,
    the masks and the paste-back read from the records give the references' answers."""
    _cuda_only(ops)
    rng = np.random.default_rng(43)
    w, h, size, n = 641, 359, 128, 3
    recs = [ops.param_record() for _ in range(2)]
    mean, std = (127.5, 127.5, 127.5), (127.5, 127.5, 127.5)
    for f in range(3):
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        mats = _mats(rng, n, w, h, size)
        crops = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        base = blend.box_mask(size, 0.3)
        lms = (align.TEMPLATES["arcface_128"][None] * size + rng.normal(0, 2, (n, 5, 2))).astype(np.float32)
        rec = recs[f % 2]
        rec.clear()
        with ops.activate(), records.recording(ops, rec):
            dframe = ops.asarray(frame)
            norm = warp.warp_crops_normalized(
                ops, dframe, mats, size, mean, std, True, out=poisoned(ops, (n, 3, size, size), "float32")
            )
            masks = kmask.landmark_masks(ops, lms, n, ops.asarray(base), ops.empty((n, size, size), np.float32))
            blend.paste_back(ops, dframe, ops.asarray(crops), mats, masks, n)
            rec.close(ops)
            got_norm, got_masks, got_frame = host(ops, norm), host(ops, masks), host(ops, dframe)
        assert [s[1] for s in rec.signature] == ["warp_crops_norm_f32_rec", "landmark_masks_rec", "paste_back_rec"]
        ref_norm = warp.warp_crops_normalized_ref(frame, mats, size, mean, std, True)
        np.testing.assert_allclose(got_norm, ref_norm, rtol=0, atol=1e-4)
        ref_masks = kmask.landmark_masks_ref(lms, n, base, np.zeros((n, size, size), np.float32))
        np.testing.assert_allclose(got_masks, ref_masks, atol=1e-3)
        ref_frame = blend.paste_back_ref(frame.copy(), crops, mats, ref_masks, n)
        d = np.abs(got_frame.astype(np.int16) - ref_frame.astype(np.int16))
        assert d.max() <= 1 and (got_frame != frame).any()


def test_the_graph_probe_says_what_it_needs_where_there_is_no_gpu(capsys):
    """``benchmarks.graph_probe`` (the capture and replay of the swap part on a GPU, issue 43's open
    questions) exits 2 with the reason on a machine without CUDA."""
    from benchmarks import graph_probe
    from vcam.ops import cuda_status

    if cuda_status()[0]:
        pytest.skip("a CUDA GPU is here: gpu_check.sh graphprobe runs the probe itself")
    assert graph_probe.main(["--iters", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
