"""Per-person mapping: the state's mappings, the Assigner, and loading [[swap.map]] at start."""

from __future__ import annotations

import re
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import two_people

from vcam import config_file as vconfig
from vcam.errors import ConfigError, ControlError, FaceError
from vcam.models import registry, standin
from vcam.models.download import crc32_text
from vcam.runtime.roles import build as build_role
from vcam.runtime.roles import model_store
from vcam.stages import demo
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.faces import FaceBank
from vcam.stages.mapping import Assigner, face_name, is_photo_arg, load_mappings
from vcam.stages.swap import make_builtin
from vcam.stages.track import Tracker
from vcam.state import Mapping, RuntimeState, Snapshot
from vcam.types import SourceFace, Track

ASSETS = Path(demo.__file__).parents[1] / "assets"
DIM = 8


def _map_args(cfg):
    """``load_mappings``' entries and faces folder from a config."""
    return cfg.swap.map, cfg.faces_dir


def solid(name: str, value: int = 0, embedding: np.ndarray | None = None) -> SourceFace:
    img = np.full((128, 128, 3), value, np.uint8)
    return SourceFace(name=name, image=img, embeddings={} if embedding is None else {"fake": embedding})


def unit(i: int) -> np.ndarray:
    e = np.zeros(DIM, np.float32)
    e[i] = 1.0
    return e


def person(i: int, track_id: int) -> Track:
    """A track whose face belongs to person ``i`` (the fake recogniser reads it off the landmarks)."""
    lms = np.zeros((5, 2), np.float32)
    lms[0, 0] = i
    return Track(id=track_id, box=np.array([0, 0, 10, 10], np.float32), landmarks=lms, score=0.9)


class FakeRecogniser:
    """Embeddings known in advance: person i (landmark x of the first point) is unit vector i;
    person 7 is halfway between 0 and 1 (similarity 0.707 to both). Counts calls and faces."""

    name = "fake"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def embed(self, frame: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
        lms = np.asarray(landmarks).reshape(-1, 5, 2)
        self.calls.append(len(lms))
        out = []
        for lm in lms:
            i = int(lm[0, 0])
            out.append(unit(0) + unit(1) if i == 7 else unit(i) * 3.0)  # raw, not normalised
        return np.stack(out)


class HostFrames:
    """``host_frame`` for the Assigner, counting downloads."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> np.ndarray:
        self.calls += 1
        return np.zeros((32, 32, 3), np.uint8)


@pytest.fixture
def state() -> RuntimeState:
    st = RuntimeState({n: solid(n, v) for n, v in (("alice", 10), ("bob", 20), ("grace", 30), ("zed", 40))}, active="alice")
    st.set_target_loader(lambda arg: solid(face_name(arg), embedding=unit({"ann": 0, "ben": 1, "cid": 2}[face_name(arg)])))
    return st


# --- the state ----------------------------------------------------------------------------------


def test_snapshot_is_a_pointer_read_and_mappings_resolve_to_faces(state):
    snap = state.snapshot()
    assert state.snapshot() is snap and snap.mapping == ()  # nothing changed: the same object
    assert state.set_mapping("ann", "grace") == {"ann": "grace"}
    snap2 = state.snapshot()
    assert snap2 is not snap and snap2.version > snap.version
    assert len(snap2.mapping) == 1 and isinstance(snap2.mapping[0], Mapping)
    assert snap2.mapping[0].target.name == "ann" and snap2.mapping[0].source.name == "grace"
    assert snap2.face.name == "alice"  # mapping never changes the active face
    state.set_mapping("ben", "zed")
    state.set_mapping("ann", "bob")  # re-mapped: keeps its place in the order
    assert state.mappings == {"ann": "bob", "ben": "zed"}
    assert [(m.target.name, m.source.name) for m in state.snapshot().mapping] == [("ann", "bob"), ("ben", "zed")]
    # A source replaced on disk and reloaded: the mapping uses the new face from the next snapshot.
    new_bob = solid("bob", 99)
    state.add_face(new_bob)
    assert state.snapshot().mapping[0].source is new_bob
    assert state.remove_mapping("ann") == {"ben": "zed"}
    assert [m.target.name for m in state.snapshot().mapping] == ["ben"]


def test_listeners_hear_mapping_changes_and_same_mapping_is_no_change(state):
    seen: list[Snapshot] = []
    state.subscribe(seen.append)
    state.set_mapping("ann", "grace")
    assert len(seen) == 1 and seen[0].mapping[0].source.name == "grace"
    version = state.snapshot().version
    state.set_mapping("ann", "grace")
    assert len(seen) == 1 and state.snapshot().version == version
    state.remove_mapping("ann")
    assert len(seen) == 2 and seen[1].mapping == ()


def test_unknown_faces_and_targets_name_what_is_known(state):
    with pytest.raises(FaceError, match=r"unknown face 'nobody'") as info:
        state.set_mapping("ann", "nobody")
    assert info.value.hint == "known faces: alice, bob, grace, zed"
    assert state.mappings == {}
    with pytest.raises(FaceError, match=r"'ann' has no mapping") as info:
        state.remove_mapping("ann")
    assert info.value.hint == "there are no mappings"
    state.set_mapping("ann", "bob")
    with pytest.raises(FaceError, match=r"'ben' has no mapping") as info:
        state.remove_mapping("ben")
    assert info.value.hint == "mapped targets: ann"
    with pytest.raises(ControlError, match=r"a mapping needs a target and a source"):
        state.set_mapping("", "bob")


def test_sources_load_through_the_face_loader_and_never_become_active(state):
    loaded: list[str] = []

    def loader(name: str) -> SourceFace:
        if name != "dave":
            raise FaceError(f"unknown face '{name}'", hint="known faces: dave")
        loaded.append(name)
        return solid(name, 77)

    state.set_loader(loader)
    state.set_mapping("ann", "dave")
    assert loaded == ["dave"] and "dave" in state.names and state.active == "alice"
    assert state.snapshot().mapping[0].source.name == "dave"
    state.set_mapping("ben", "dave")
    assert loaded == ["dave"]  # loaded once
    with pytest.raises(FaceError, match=r"unknown face 'erin' \(known faces: dave\)"):
        state.set_mapping("ann", "erin")
    # With no active face, a mapping's source still does not become the active one.
    bare = RuntimeState()
    bare.set_target_loader(lambda arg: solid(arg, embedding=unit(0)))
    bare.set_loader(loader)
    bare.set_mapping("ann", "dave")
    assert bare.active is None and bare.snapshot().face is None and len(bare.snapshot().mapping) == 1


def test_targets_given_as_photos_are_found_by_name_or_path(state):
    calls: list[str] = []
    state.set_target_loader(lambda arg: calls.append(arg) or solid(face_name(arg), embedding=unit(2)))
    state.set_mapping("/photos/cid.jpg", "grace")
    assert state.mappings == {"cid": "grace"} and calls == ["/photos/cid.jpg"]
    state.set_mapping("/photos/cid.jpg", "bob")  # known by what it was given as: not loaded again
    state.set_mapping("cid", "zed")
    assert calls == ["/photos/cid.jpg"] and state.mappings == {"cid": "zed"}
    assert state.remove_mapping("/photos/cid.jpg") == {}


def test_mapping_is_off_without_a_recogniser_and_says_how_to_turn_it_on():
    st = RuntimeState({"bob": solid("bob")}, active="bob")
    assert not st.mapping_enabled
    with pytest.raises(ControlError, match=r"^per-person mapping is off in this run \(no recogniser is loaded\)") as info:
        st.set_mapping("ann", "bob")
    assert "--map TARGET=SOURCE" in info.value.hint and "[[swap.map]]" in info.value.hint
    # Targets registered at start but no loader: only those can be mapped.
    st.add_target(solid("ann", embedding=unit(0)))
    assert st.mapping_enabled
    st.set_mapping("ann", "bob")
    with pytest.raises(FaceError, match=r"unknown target 'ben' \(known targets: ann\)"):
        st.set_mapping("ben", "bob")
    with pytest.raises(FaceError, match=r"target face 'x' has no recogniser embedding"):
        st.add_target(solid("x"))


# --- the Assigner -------------------------------------------------------------------------------


def _names(pairs) -> list[tuple[int, str]]:
    return [(t.id, f.name) for t, f in pairs]


def test_without_mappings_every_face_gets_the_active_face_and_nothing_is_recognised(state):
    rec, host = FakeRecogniser(), HostFrames()
    assigner = Assigner(rec, 0.5, "keep")
    tracks = [person(0, 1), person(1, 2)]
    assert _names(assigner.assign(tracks, host, state.snapshot())) == [(1, "alice"), (2, "alice")]
    assert rec.calls == [] and host.calls == 0
    empty = Snapshot(face=None, swap_enabled=True, version=0)
    assert assigner.assign(tracks, host, empty) == []
    assert rec.calls == [] and host.calls == 0


def test_each_person_gets_their_source_and_identity_is_computed_once_per_track(state):
    rec, host = FakeRecogniser(), HostFrames()
    assigner = Assigner(rec, 0.5, "active")
    state.set_mapping("ann", "grace")  # person 0
    state.set_mapping("ben", "zed")  # person 1
    tracks = [person(2, 10), person(1, 11), person(0, 12)]  # person 2 is nobody's target
    assert _names(assigner.assign(tracks, host, state.snapshot())) == [(10, "alice"), (11, "zed"), (12, "grace")]
    assert rec.calls == [3] and host.calls == 1  # one batched call for the three new tracks
    for _ in range(5):  # the same tracks on later frames: no recogniser call, no download
        assert _names(assigner.assign(tracks, host, state.snapshot())) == [(10, "alice"), (11, "zed"), (12, "grace")]
    assert rec.calls == [3] and host.calls == 1
    # A new track appears, one leaves: one call for the new one; the gone one's identity is dropped.
    tracks = [person(1, 11), person(0, 13), person(2, 10)]
    assert _names(assigner.assign(tracks, host, state.snapshot())) == [(11, "zed"), (13, "grace"), (10, "alice")]
    assert rec.calls == [3, 1] and host.calls == 2
    assert assigner.identity(12) is None and assigner.identity(13) is not None
    # Mapping changed from control: applied from the next frame, without recognising anyone again.
    state.remove_mapping("ben")
    state.set_face("bob")
    assert _names(assigner.assign(tracks, host, state.snapshot())) == [(11, "bob"), (13, "grace"), (10, "bob")]
    assert rec.calls == [3, 1]


def test_match_says_which_target_a_track_matched_and_what_it_gets(state):
    """Assigner.match (the panel's people in view) answers as assign decided, without recognising anyone."""
    rec, host = FakeRecogniser(), HostFrames()
    assigner = Assigner(rec, 0.5, "active")
    assert assigner.match(1, state.snapshot()) == (None, state.face("alice"))  # no mappings: the active face
    state.set_mapping("ben", "zed")
    tracks = [person(1, 1), person(2, 2)]
    pairs = assigner.assign(tracks, host, state.snapshot())
    assert rec.calls == [2]
    snap = state.snapshot()
    for t, source in pairs:
        target, got = assigner.match(t.id, snap)
        assert got is source
    assert assigner.match(1, snap)[0] == "ben" and assigner.match(2, snap) == (None, state.face("alice"))
    assert assigner.match(99, snap) == (None, state.face("alice"))  # not recognised (yet)
    assert Assigner(rec, 0.5, "keep").match(99, snap) == (None, None)
    assert rec.calls == [2]


def test_unmatched_keep_leaves_faces_out_and_order_is_kept(state):
    rec, host = FakeRecogniser(), HostFrames()
    assigner = Assigner(rec, 0.5, "keep")
    state.set_mapping("ben", "zed")
    tracks = [person(1, 1), person(0, 2), person(2, 3), person(1, 4)]
    # Two faces match the same target: both get its source (each face is judged on its own).
    assert _names(assigner.assign(tracks, host, state.snapshot())) == [(1, "zed"), (4, "zed")]
    # With no active face and 'active', unmatched faces are left out as well.
    active = Assigner(rec, 0.5, "active")
    no_face = Snapshot(face=None, swap_enabled=True, version=99, mapping=state.snapshot().mapping)
    assert _names(active.assign(tracks, host, no_face)) == [(1, "zed"), (4, "zed")]


def test_threshold_and_the_best_target_decide(state):
    rec, host = FakeRecogniser(), HostFrames()
    state.set_mapping("ben", "zed")  # person 1
    state.set_mapping("ann", "grace")  # person 0
    halfway = [person(7, 1)]  # similarity 0.707 to both ann and ben
    assert _names(Assigner(rec, 0.7, "keep").assign(halfway, host, state.snapshot())) == [(1, "zed")]  # the first of a tie
    assert _names(Assigner(rec, 0.71, "keep").assign(halfway, host, state.snapshot())) == []
    assert _names(Assigner(rec, 0.71, "active").assign(halfway, host, state.snapshot())) == [(1, "alice")]
    with pytest.raises(ValueError, match=r"unmatched must be 'active' or 'keep', got 'swap'"):
        Assigner(rec, 0.5, "swap")


def test_without_a_recogniser_mappings_fall_back_to_the_active_face(state, caplog):
    state.set_mapping("ann", "grace")
    host = HostFrames()
    assigner = Assigner(None, 0.5, "keep")
    for _ in range(3):
        assert _names(assigner.assign([person(0, 1)], host, state.snapshot())) == [(1, "alice")]
    assert host.calls == 0
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "mappings are set but no recogniser is loaded: every face gets the active face"
    ]


# --- loading [[swap.map]] with the real detector and (stand-in) recogniser ------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    p = standin.write("arcface_w600k_r50", d, tiny=True)
    (d / registry.get("arcface_w600k_r50").hash_file).write_text(crc32_text(p.read_bytes()))
    return d


@pytest.fixture(scope="module")
def detector():
    return RetinaFaceDetector()


@pytest.fixture(scope="module")
def recogniser(models):
    cfg = vconfig.build({"models": {"dir": str(models)}, "pipeline": {"backend": "onnxruntime", "device": "cpu"}})
    return build_role("recogniser", cfg, store=model_store(cfg, progress=False))


@pytest.fixture(scope="module")
def bank_dir(tmp_path_factory, detector):
    d = tmp_path_factory.mktemp("faces")
    bank = FaceBank(d)
    bank.add(ASSETS / "astronaut.jpg", "astronaut", detector=detector)
    bank.add(ASSETS / "grace_hopper.jpg", "hopper", detector=detector)
    return d


def map_cfg(bank_dir, models, entries, **swap):
    return vconfig.build(
        {
            "faces": {"dir": str(bank_dir)},
            "models": {"dir": str(models)},
            "swap": {"map": entries, **swap},
            "pipeline": {"device": "cpu"},
        }
    )


def loaded_state(bank_dir, recogniser) -> RuntimeState:
    """What load_faces leaves behind: the bank's faces loaded, hopper active."""
    swapper = make_builtin("classic")
    bank = FaceBank(bank_dir)
    st = RuntimeState()
    for n in bank.names():
        st.add_face(bank.load(n, recogniser=recogniser, swappers=[swapper]))
    st.set_face("hopper")
    return st


def test_load_mappings_then_each_person_in_frame_gets_their_face(bank_dir, models, detector, recogniser):
    """--map ASTRONAUT_PHOTO=hopper --map hopper=astronaut: the two swap faces, found by the real
    detector and tracker, told apart by the recogniser."""
    swapper = make_builtin("classic")
    cfg = map_cfg(
        bank_dir,
        models,
        [{"target": str(ASSETS / "astronaut.jpg"), "source": "hopper"}, {"target": "hopper", "source": "astronaut"}],
    )
    st = loaded_state(bank_dir, recogniser)
    load_mappings(cfg.swap.map, cfg.faces_dir, st, detector=detector, recogniser=recogniser, swapper=swapper)
    assert st.mappings == {"astronaut": "hopper", "hopper": "astronaut"}
    assert st.active == "hopper" and st.mapping_enabled
    snap = st.snapshot()
    for m in snap.mapping:
        assert m.target.embeddings[recogniser.name].shape == (512,)
        assert "classic" in m.source.latents  # prepared for the swapper
    frame = two_people()
    tracker = Tracker(detector, cfg.track, max_faces=4)
    tracks = tracker.update(frame, 0)
    tracks = sorted(tracks, key=lambda t: float(t.box[0]))
    assert len(tracks) == 2
    assigner = Assigner(recogniser, cfg.swap.map_threshold, cfg.swap.unmatched)
    pairs = assigner.assign(tracks, lambda: frame, snap)
    assert _names(pairs) == [(tracks[0].id, "hopper"), (tracks[1].id, "astronaut")]
    # Unmapping the astronaut: with 'active' that face gets the active face (hopper as well).
    st.remove_mapping(str(ASSETS / "astronaut.jpg"))
    assert _names(assigner.assign(tracks, lambda: frame, st.snapshot())) == [
        (tracks[0].id, "hopper"),
        (tracks[1].id, "astronaut"),
    ]
    st.set_face("astronaut")
    assert _names(assigner.assign(tracks, lambda: frame, st.snapshot())) == [
        (tracks[0].id, "astronaut"),
        (tracks[1].id, "astronaut"),
    ]
    # At runtime a target photo loads through the state's target loader (what `vcam ctl map` uses).
    st.set_mapping(str(ASSETS / "astronaut.jpg"), "hopper")
    assert st.mappings == {"hopper": "astronaut", "astronaut": "hopper"}


def test_load_mappings_photo_source_is_added_without_becoming_active(bank_dir, models, detector, recogniser, tmp_path):
    photo = tmp_path / "grace.png"
    cv2.imwrite(str(photo), demo.portrait("grace_hopper"))
    cfg = map_cfg(bank_dir, models, [{"target": "astronaut", "source": str(photo)}])
    st = loaded_state(bank_dir, recogniser)
    load_mappings(cfg.swap.map, cfg.faces_dir, st, detector=detector, recogniser=recogniser, swapper=make_builtin("classic"))
    assert st.mappings == {"astronaut": "grace"} and "grace" in st.names and st.active == "hopper"


def test_load_mappings_errors_are_one_line_with_the_fix(bank_dir, models, detector, recogniser, tmp_path):
    swapper = make_builtin("classic")
    kw = {"detector": detector, "recogniser": recogniser, "swapper": swapper}
    blank = tmp_path / "wall.png"
    cv2.imwrite(str(blank), np.full((200, 200, 3), 128, np.uint8))
    where = re.escape(str(blank))
    group = tmp_path / "group.png"
    a, h = demo.portrait("astronaut"), demo.portrait("grace_hopper")
    two = [(h, demo.placement((256, 250), (250, 250), 0.7, 0)), (a, demo.placement((192, 160), (700, 230), 1.0, 0))]
    cv2.imwrite(str(group), demo.compose((960, 480), two))
    cases = [
        ([{"target": str(blank), "source": "hopper"}], FaceError, rf"^no face found in map target photo {where} \(use a photo"),
        ([{"target": str(tmp_path / "nope.jpg"), "source": "hopper"}], FaceError, r"^map target photo not found: .*nope\.jpg"),
        (  # issue 40: a group photo as a target is refused, its faces listed, the way to pick one named
            [{"target": str(group), "source": "hopper"}],
            FaceError,
            r"^2 faces found in map target photo .*group\.png \(1: at x=\d+ .*; 2: at .*--pick K --name NAME",
        ),
        (
            [{"target": "nobody", "source": "hopper"}],
            FaceError,
            r"^unknown map target 'nobody': no such face in the face bank, and not a photo path \(known faces: astronaut, hop",
        ),
        ([{"target": "astronaut", "source": "nobody"}], FaceError, r"^unknown map source 'nobody'"),
        (
            [{"target": "astronaut", "source": "hopper"}, {"target": str(ASSETS / "astronaut.jpg"), "source": "hopper"}],
            ConfigError,
            r"^\[swap\] map: the target 'astronaut' is mapped twice",
        ),
    ]
    for entries, kind, pattern in cases:
        st = loaded_state(bank_dir, recogniser)
        with pytest.raises(kind, match=pattern) as info:
            load_mappings(*_map_args(map_cfg(bank_dir, models, entries)), st, **kw)
        assert "\n" not in str(info.value)
    # No recogniser: the entries cannot work, and the error says why and what to do.
    st = loaded_state(bank_dir, recogniser)
    with pytest.raises(ConfigError, match=r"^\[swap\] map needs the face recogniser") as info:
        load_mappings(
            *_map_args(map_cfg(bank_dir, models, [{"target": "astronaut", "source": "hopper"}])), st, **{**kw, "recogniser": None}
        )
    assert "vcam models pull arcface_w600k_r50" in info.value.hint
    # No entries and no recogniser: nothing to do, and runtime mapping stays off.
    load_mappings(*_map_args(map_cfg(bank_dir, models, [])), st, **{**kw, "recogniser": None})
    assert not st.mapping_enabled and st.mappings == {}


def test_photo_args_and_their_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "me.jpg").write_bytes(b"x")
    assert is_photo_arg("me.jpg") and face_name("me.jpg") == "me"
    assert is_photo_arg("photos/you.png") and face_name("photos/you.png") == "you"
    assert not is_photo_arg("alice") and face_name("alice") == "alice"
    assert not is_photo_arg("alice.v2") and face_name("alice.v2") == "alice.v2"  # a bank name with a dot


@pytest.mark.slow
def test_the_daemon_swaps_only_the_mapped_person(bank_dir, models):
    """`vcam run --input demo --map ...` end to end. The demo films Grace Hopper: mapped to the
    astronaut's face she is swapped; with only the astronaut mapped (unmatched 'keep') she is left
    as filmed."""
    from dataclasses import replace

    from vcam.runtime.daemon import Daemon
    from vcam.stages.outputs import NullOutput
    from vcam.types import PixelFormat

    class Capturing(NullOutput):
        def __init__(self):
            super().__init__(320, 240, 30.0, fmt=PixelFormat.BGR)
            self.seen = []

        def send(self, data):
            super().send(data)
            self.seen.append(np.array(data, copy=True))

    def run(entries, swap=True):
        cfg = vconfig.build(
            {
                "capture": {"input": "demo", "width": 320, "height": 240, "pacing": "fast"},
                "pipeline": {"device": "cpu", "max_latency": 0, "backend": "onnxruntime"},
                "faces": {"dir": str(bank_dir)},
                "models": {"dir": str(models)},
                "swap": {"map": entries, "unmatched": "keep", "map_threshold": 0.5},
            }
        )
        cfg = cfg.replace(output=replace(cfg.output, target="null"))
        out = Capturing()
        d = Daemon(cfg, output=out, control=False)
        d.state.set_swap(swap)
        summary = d.run(max_frames=4)
        assert summary.frames_out == 4, summary.error
        return d, np.stack(out.seen).astype(np.int16)

    d, mapped = run([{"target": "hopper", "source": "astronaut"}])
    assert d.state.mappings == {"hopper": "astronaut"}
    astronaut_only = [{"target": str(ASSETS / "astronaut.jpg"), "source": "hopper"}]
    d, other = run(astronaut_only)
    assert d.state.mappings == {"astronaut": "hopper"}
    _, off = run(astronaut_only, swap=False)
    assert np.abs(mapped - off).mean() > 0.5  # Grace Hopper got the astronaut's face
    assert np.array_equal(other, off)  # nobody matched: kept as filmed
