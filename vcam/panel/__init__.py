"""The control panel in the browser (and in OBS as a Custom Browser Dock): faces, mapping, a live
preview and health, served by the daemon (:mod:`.server`), guarded by a per-run token
(:mod:`.access`), fed by the running daemon through :class:`.view.Backend` (the runtime implements
it) and the preview tap the frame loop offers its published frames to (:mod:`.preview`).

Layer: above ``control`` (commands take the path of ``vcam ctl``), below ``runtime`` (which starts it).
"""
