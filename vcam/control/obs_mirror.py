"""OBS's side of the control scenes as :class:`~vcam.control.obs.ObsController` last saw it, and the
rules that keep it in step with vcam's state (the module docstring of :mod:`vcam.control.obs` tells
the behaviour): which source each scene item is, which visibility events are the echoes of our own
changes, the sync that makes the scenes show the state, and the merge after a reconnect. Called
from the controller's worker thread only, with the request client of the current connection."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vcam.control.obs_scene import (
    DEFAULT_CHOICE,
    FACE_PREFIX,
    PAUSE_SOURCE,
    SWAP_SOURCE,
    input_settings,
    map_choice,
    map_source_name,
    map_target,
    request_failed,
    scene_names,
)
from vcam.state import RuntimeState

log = logging.getLogger(__name__)


class SceneMirror:
    """The control scene ``scene`` and its map scenes (``<scene>: <target>``) as last seen, and the
    status source's presence."""

    def __init__(self, scene: str, status_source: str) -> None:
        self.scene, self.status_source = scene, status_source
        # (scene, scene item id) -> source name, in the control scene and the map scenes (ids are per scene)
        self.items: dict[tuple[str, int], str] = {}
        self.echoes: dict[tuple[str, int], list[bool]] = {}  # visibility changes we made, whose events are ours
        self.has_status = False
        # (face, swap, mappings) both sides last agreed on
        self.synced: tuple[str | None, bool, dict[str, str]] | None = None

    def watches(self, scene: str) -> bool:
        """Is ``scene`` the control scene or one of its map scenes?"""
        return scene == self.scene or map_target(self.scene, scene) is not None

    def scenes(self, req: Any) -> list[str]:
        """The control scene (if it exists) and the map scenes, as OBS lists them now."""
        return [n for n in scene_names(req) if self.watches(n)]

    def sources(self, scene: str) -> set[str]:
        """The source names of ``scene``'s items, as last seen."""
        return {name for (sc, _), name in self.items.items() if sc == scene}

    def refresh(self, req: Any) -> None:
        """Look at the scenes again (their structure changed, or a request named a missing item)."""
        self.items = {}
        for scene in self.scenes(req):
            try:
                items = req.get_scene_item_list(scene).scene_items
            except Exception as exc:
                if not request_failed(exc):
                    raise
                continue  # listed while OBS removes it (the user deleted it): its events refresh again
            for it in items:
                self.items[(scene, int(it["sceneItemId"]))] = it["sourceName"]
        self.has_status = bool(self.status_source) and input_settings(req, self.status_source) is not None

    def changed(self, req: Any, scene: str, item_id: int, enabled: bool) -> str | None:
        """A visibility event: the source it is about, or None where it is the echo of our own
        change (the state already says so) or an item no longer there."""
        key = (scene, int(item_id))
        pending = self.echoes.get(key)
        if pending and pending[0] == enabled:
            pending.pop(0)
            return None
        name = self.items.get(key)
        if name is None:
            self.refresh(req)
            name = self.items.get(key)
        return name

    def sync(self, req: Any, state: RuntimeState, *, merge: bool = False, skip_if: Callable[[], int] | None = None) -> None:
        """Make the scenes show ``state``: only the active face visible, the swap and pause sources
        = swap on and paused, and in each map scene only the target's face (or ``(default)``).

        ``merge`` (after a reconnect): first adopt what OBS changed while we were apart, where the
        state itself did not change since both last agreed. ``skip_if``: leave it all to the next
        call when it returns non-zero once the scenes are read (events waiting, which may explain
        a difference)."""
        scenes = {scene: req.get_scene_item_list(scene).scene_items for scene in self.scenes(req)}
        if skip_if is not None and skip_if():
            return
        if merge and self.synced is not None:
            self._adopt(state, scenes, *self.synced)
        active, swap, mappings = state.active, state.swap_enabled, state.mappings
        paused = state.paused  # vcam's own, after a reconnect too (never merged from OBS)
        for scene, items in scenes.items():
            target = map_target(self.scene, scene)
            for it in items:
                name, shown = it["sourceName"], bool(it["sceneItemEnabled"])
                key = (scene, int(it["sceneItemId"]))
                self.items[key] = name
                if target is not None:
                    choice = map_choice(target, name)
                    if choice is None:
                        continue
                    want = choice == mappings.get(target, DEFAULT_CHOICE)
                elif name.startswith(FACE_PREFIX):
                    want = name[len(FACE_PREFIX) :] == active
                elif name == SWAP_SOURCE:
                    want = swap
                elif name == PAUSE_SOURCE:
                    want = paused
                else:
                    continue
                if want != shown:
                    self.echoes.setdefault(key, []).append(want)
                    req.set_scene_item_enabled(scene, it["sceneItemId"], want)
        self.synced = (active, swap, mappings)

    def _adopt(
        self, state: RuntimeState, scenes: dict[str, list], last_face: str | None, last_swap: bool, last_maps: dict
    ) -> None:
        """What OBS shows that changed since both sides last agreed, taken into ``state`` where the
        state did not change meanwhile (a face shown, swap toggled, a map choice)."""
        items = scenes.get(self.scene, [])
        faces = [
            i["sourceName"][len(FACE_PREFIX) :]
            for i in items
            if i["sourceName"].startswith(FACE_PREFIX) and i["sceneItemEnabled"]
        ]
        swap = [bool(i["sceneItemEnabled"]) for i in items if i["sourceName"] == SWAP_SOURCE]
        if len(faces) == 1 and faces[0] != last_face and state.active == last_face:
            try:
                state.set_face(faces[0])
                log.info("OBS showed '%s' while vcam was away; switched to it", faces[0])
            except Exception as exc:
                log.warning("OBS shows '%s%s' but it cannot be used: %s", FACE_PREFIX, faces[0], exc)
        if swap and swap[0] != last_swap and state.swap_enabled == last_swap:
            state.set_swap(swap[0])
            log.info("swap was turned %s in OBS while vcam was away", "on" if swap[0] else "off")
        for scene, scene_items in scenes.items():
            target = map_target(self.scene, scene)
            if target is None:
                continue
            shown = [c for i in scene_items if i["sceneItemEnabled"] and (c := map_choice(target, i["sourceName"])) is not None]
            last = last_maps.get(target, DEFAULT_CHOICE)
            if len(shown) == 1 and shown[0] != last and state.mappings.get(target, DEFAULT_CHOICE) == last:
                try:
                    if shown[0] == DEFAULT_CHOICE:
                        state.remove_mapping(target)
                    else:
                        state.set_mapping(target, shown[0])
                    log.info("OBS chose '%s' for '%s' while vcam was away; applied", shown[0], target)
                except Exception as exc:
                    log.warning("OBS shows '%s' but it cannot be used: %s", map_source_name(target, shown[0]), exc)


__all__ = ["SceneMirror"]
