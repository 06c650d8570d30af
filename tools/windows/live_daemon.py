"""A live daemon for the Windows run's `ctl` step: the demo paced as a camera, published to an output
the daemon is handed (it cannot tell that from a camera or a virtual camera, which Wine lacks), with
the control socket and the panel at the user's defaults, as `vcam run` with a camera has them. A
plain `vcam run --input demo --output null` is a conversion (no camera, no virtual camera): it
leaves local control to a live daemon, so `vcam ctl` would find nothing."""

from dataclasses import replace

from vcam.config import Config
from vcam.runtime.daemon import Daemon
from vcam.stages.outputs import NullOutput

cfg = Config()
cfg = cfg.replace(
    capture=replace(cfg.capture, input="demo", width=320, height=240, fps=10.0),
    pipeline=replace(cfg.pipeline, device="cpu"),
)
d = Daemon(cfg, output=NullOutput(320, 240), panel=True, announce=lambda line: print(line, flush=True))
d.install_signal_handlers()
print("stopped:", d.run().frames_out, flush=True)
