"""The ``remote`` backend: a model served by a KServe V2 server (NVIDIA Triton, PyTriton's Triton,
KServe, MLServer) over gRPC, through ``tritonclient.grpc`` (``pip install 'fastswap-cam[remote]'``).

Never picked by ``auto``: faces leave the machine only when a role's config says so
(``[engines.swapper] backend = "remote"``). The engine is built directly, not by
:func:`~vcam.engines.create_engine`, since it needs a URL and credentials rather than a file.

- **Start**: the served model's inputs, outputs, dtypes and max batch are read from the server and
  checked against ``expect`` (the local model's description); a mismatch is one line naming both.
  ``inputs`` are the local description (FP32, as the stages write them); what goes on the wire is
  the served dtype: uint8 crops where the served model takes uint8 (``vcam serve export
  --uint8-input`` puts the cast in the model), else FP16 or FP32 as served. A server that does not
  answer at all at start (refused, or silent for ``connect_timeout``) does not end the run: the
  engine starts down (one line) and its faces take the fallback from the first frame; the served
  model is read and checked once the server answers (a mismatch then keeps it down, one error line).
- **Calls**: :meth:`RemoteEngine.submit` sends (``async_infer``, chunks of the server's max batch)
  and returns at once; :meth:`RemoteEngine.wait` takes the answer. :meth:`run_device` is both. The
  encoded rows of an input that did not change since the last call (the source latents: they change
  on a face switch only) are reused, not converted again.
- **Any answer is survivable, faults never block**: :meth:`RemoteEngine.wait` waits at most
  ``timeout`` from the call's :meth:`~RemoteEngine.submit` (the frame's budget for the server) and
  checks every answer (each output present, its datatype the served one, its shape the rows asked
  for, finite values); a call that is late, refused, answered with an error or malformed gives NaN
  rows, and NaN rows of an answer are faults of their faces alone. The faulted rows are
  :attr:`~RemoteEngine.last_bad` (the swapper swaps them locally, pixelates them or passes them
  through: ``on_fault``) and counted in :attr:`~RemoteEngine.failed`.
- **One line per episode (hysteresis)**: the server is marked down after :data:`DOWN_AFTER` faulted
  calls in a row (one warning line); while down nothing is sent (no frame waits on a dead server)
  and a background thread asks whether the model is ready, with backoff (:data:`BACKOFF`); once it
  is, the server is on trial: one call at a time goes out, its good answer used at once, and after
  :data:`UP_AFTER` good answers in a row it is back (one line). A fault on trial is the same
  episode: down again, silently. :meth:`health` says ``remote HOST:PORT down since HH:MM:SS``.
- **Security**: crops and latents are biometric data. A URL to another host needs ``grpcs://`` and
  a token (sent as ``authorization: Bearer``) or a client certificate; plain gRPC is for loopback.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from vcam.engines import TensorInfo, check_feeds, reused_inputs
from vcam.errors import ConfigError, EngineUnavailable, ModelError

log = logging.getLogger(__name__)

#: KServe V2 datatypes and their NumPy dtypes (the ones vcam's models use).
V2_DTYPES = {"FP32": np.float32, "FP16": np.float16, "UINT8": np.uint8, "INT64": np.int64, "INT32": np.int32}
INSTALL = "pip install 'fastswap-cam[remote]' (tritonclient[grpc])"
#: Seconds between readiness probes while the server is down: doubling from the first to the last
#: (the last bounds how long a server that is back waits to be asked again).
BACKOFF = (0.1, 0.3)
#: Faulted calls in a row after which the server is down (one line), and good answers in a row after
#: which a server that answered its probe again is back (one line).
DOWN_AFTER = 3
UP_AFTER = 3


#: gRPC statuses of a server that is not there (yet): the run starts with it down, not ended.
UNREACHABLE = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")


class _Unreachable(EngineUnavailable):
    """The server did not answer at all (see :data:`UNREACHABLE`); ``why``: gRPC's words."""

    def __init__(self, message: str, *, hint: str, why: str) -> None:
        super().__init__(message, hint=hint)
        self.why = why


@dataclass(frozen=True)
class Endpoint:
    """A parsed ``grpc://`` / ``grpcs://`` URL: ``address`` is what tritonclient takes."""

    host: str
    port: int
    tls: bool

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_url(url: str, *, token: str = "", cert: str = "", where: str = "[engines.swapper] url") -> Endpoint:
    """``grpc://HOST:PORT`` or ``grpcs://HOST:PORT`` (port 8001 by default). Plain gRPC to another
    host, or TLS to another host without a token or client certificate, is refused (ConfigError)."""
    text = url.strip()
    parts = urlsplit(text if "://" in text else f"grpc://{text}")
    if parts.scheme not in ("grpc", "grpcs") or not parts.hostname:
        raise ConfigError(f"{where}: expected grpc://HOST:PORT or grpcs://HOST:PORT, got {url!r}", hint="fix the URL")
    try:
        port = parts.port or 8001
    except ValueError:
        raise ConfigError(f"{where}: bad port in {url!r}", hint="fix the URL") from None
    ep = Endpoint(parts.hostname, port, parts.scheme == "grpcs")
    if not ep.loopback and not ep.tls:
        raise ConfigError(
            f"{where}: plain gRPC to {ep.address} refused (faces are biometric data); "
            "use grpcs:// with a token or client certificate",
            hint="serve with TLS (see README, 'Serve the swap from another machine')",
        )
    if not ep.loopback and not (token or cert):
        raise ConfigError(
            f"{where}: {url} needs a token or a client certificate", hint="set token_env (or token) or cert and key"
        )
    return ep


def _pem(path: str, what: str) -> str | None:
    """``path`` (tritonclient reads the file itself) once it is known to be readable; one line if not."""
    if not path:
        return None
    p = Path(path).expanduser()
    try:
        p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {path}: {exc.strerror}", hint="fix the path") from None
    return str(p)


def _dims(shape: Sequence[Any]) -> list[int]:
    return [int(d) if isinstance(d, int) else -1 for d in shape]


class RemoteEngine:
    """A model on a KServe V2 gRPC server (see the module docstring and :class:`vcam.engines.Engine`).

    ``model``: the served model's name; ``expect``: the local model's inputs/outputs (names and
    item dims; the batch dim is the server's); ``timeout``: seconds from a call's submit until its
    faces without an answer are flagged in :attr:`last_bad` (the frame's budget for the server);
    ``pixel_scale``/``pixel_shift``: how a uint8 wire input relates to the FP32 input the stages
    write (``u8 = x * scale + shift``, per channel; default: ``x * 255``);
    ``label``: the name in messages (``swapper``)."""

    backend = "remote"

    @staticmethod
    def unavailable_reason(device: str = "cpu") -> str | None:
        try:
            import tritonclient.grpc  # noqa: F401
        except ImportError:
            return f"tritonclient not installed ({INSTALL})"
        return None

    def __init__(
        self,
        url: str,
        model: str,
        *,
        expect: Sequence[TensorInfo] = (),
        expect_outputs: Sequence[TensorInfo] = (),
        max_batch: int = 8,
        timeout: float = 0.1,
        token: str = "",
        ca: str = "",
        cert: str = "",
        key: str = "",
        pixel_scale: Sequence[float] = (255.0, 255.0, 255.0),
        pixel_shift: Sequence[float] = (0.0, 0.0, 0.0),
        label: str = "model",
        connect_timeout: float = 5.0,
        device: str = "cpu",
        on_fault_text: str = "go out unswapped",
    ) -> None:
        reason = self.unavailable_reason()
        if reason:
            raise EngineUnavailable(reason, hint=INSTALL)
        import tritonclient.grpc as grpcclient

        self.endpoint = parse_url(url, token=token, cert=cert)
        self.url, self.name, self.label = url, model, label
        self.timeout = float(timeout)
        self.max_batch = int(max_batch)
        self.skipped: list[str] = []
        self._headers = {"authorization": f"Bearer {token}"} if token else None
        ep = self.endpoint
        self.client = grpcclient.InferenceServerClient(
            ep.address,
            ssl=ep.tls,
            root_certificates=_pem(ca, "CA certificate") if ep.tls else None,
            private_key=_pem(key, "client key"),
            certificate_chain=_pem(cert, "client certificate"),
            channel_args=_channel_args(grpcclient),
        )
        self._grpc = grpcclient
        #: Where the caller's arrays live: on "cuda" the input buffers are CuPy arrays and the
        #: outputs are handed back as CuPy (the wire is host memory either way).
        self.device = "cuda" if device == "cuda" else "cpu"
        self._scale = np.asarray(pixel_scale, np.float32).reshape(1, -1, 1, 1)
        self._shift = np.asarray(pixel_shift, np.float32).reshape(1, -1, 1, 1)
        self._lock = threading.Lock()
        self._down_since: float | None = None  # wall clock of the first failure of this episode
        self._state = "up"  # "up", "down" (nothing sent), "trial" (answered its probe; calls go out)
        self._faults = self._goods = 0  # faulted calls / good answers in a row
        self._trials = 0  # calls on trial in flight (one at a time)
        self._episodes = 0
        self.last_fault = ""  # why the last faulted call failed
        #: What the faces of a faulted call get (the swapper's on_fault), for the episode's line.
        self.on_fault_text = on_fault_text
        self._wake = threading.Event()
        self._closed = False
        self.failed = 0  # items that passed through because the server did not answer
        self.last_failed = 0  # items of the last wait() that did
        self.last_bad = np.zeros(0, bool)  # which rows of the last wait() had no good answer
        self.calls = 0
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # input -> (rows sent, encoded rows)
        self._storage: dict[tuple, np.ndarray] = {}
        self._expect = (list(expect), list(expect_outputs))
        self.described = False  # the served model read and checked (see _start_down)
        self._mismatch = ""  # why the served model, once reachable, did not fit (said once)
        try:
            self._describe_served(expect, expect_outputs, connect_timeout)
        except _Unreachable as exc:
            if not (expect and expect_outputs):
                raise
            self._start_down(exc.why)
        self._prober = threading.Thread(target=self._probe, name=f"vcam-remote-{label}", daemon=True)
        self._prober.start()

    # -- start ------------------------------------------------------------------------------------
    def _describe_served(self, expect: Sequence[TensorInfo], expect_out: Sequence[TensorInfo], wait: float) -> None:
        from tritonclient.utils import InferenceServerException

        where = f"{self.label}: remote model '{self.name}' at {self.endpoint.address}"
        try:
            meta = self.client.get_model_metadata(self.name, headers=self._headers, client_timeout=wait)
            conf = self.client.get_model_config(self.name, headers=self._headers, client_timeout=wait).config
        except InferenceServerException as exc:
            msg = (exc.message() or str(exc)).strip().splitlines()[0]
            hint = "start the server (vcam serve) or fix [engines.swapper] url and model"
            if str(exc.status()) in UNREACHABLE:
                raise _Unreachable(f"{where}: {msg}", hint=hint, why=msg) from None
            raise EngineUnavailable(f"{where}: {msg}", hint=hint) from None
        served_max = int(conf.max_batch_size)
        batch_dim = 1 if served_max > 0 else 0

        def infos(items: Any) -> list[TensorInfo]:
            out = []
            for t in items:
                if t.datatype not in V2_DTYPES:
                    raise ModelError(f"{where}: tensor '{t.name}' has datatype {t.datatype}, which vcam does not send")
                shape = ("N", *[int(d) for d in t.shape[batch_dim:]])
                out.append(TensorInfo(t.name, shape, np.dtype(V2_DTYPES[t.datatype])))
            return out

        self.served_inputs, self.served_outputs = infos(meta.inputs), infos(meta.outputs)
        for kind, local, served in (("inputs", expect, self.served_inputs), ("outputs", expect_out, self.served_outputs)):
            if not local:
                continue
            have = {t.name: _dims(t.shape[1:]) for t in served}
            want = {t.name: _dims(t.shape[1:]) for t in local}
            fits = set(have) == set(want) and all(
                len(have[n]) == len(want[n]) and all(a == b or -1 in (a, b) for a, b in zip(have[n], want[n])) for n in want
            )
            if not fits:
                show = lambda d: ", ".join(f"{n} {s}" for n, s in d.items())  # noqa: E731
                raise ModelError(
                    f"{where} takes {kind} {show(have)} but the local model takes {show(want)}",
                    hint="serve the same model (vcam serve export --model NAME) or fix [engines.swapper] model",
                )
        self.inputs = list(expect) or [TensorInfo(t.name, t.shape, np.dtype(np.float32)) for t in self.served_inputs]
        self.outputs = list(expect_out) or [TensorInfo(t.name, t.shape, np.dtype(np.float32)) for t in self.served_outputs]
        self._wire = {t.name: np.dtype(t.dtype) for t in self.served_inputs}
        self._out_wire = {t.name: _v2(t.dtype) for t in self.served_outputs}
        self.server_max_batch = served_max if served_max > 0 else 1
        self.precision = "uint8" if np.dtype(np.uint8) in self._wire.values() else str(self.served_inputs[0].dtype)
        self.described = True
        log.info("%s: %s (max batch %d)", self.label, self.describe(), self.server_max_batch)

    def _start_down(self, why: str) -> None:
        """A server unreachable at start (refused, or no answer within ``connect_timeout``): the run
        starts with it down, its faces taking the fallback from the first frame; the prober reads and
        checks the served model once it answers (:meth:`_ready`), then puts it on trial. Until then
        the wire is the local description (nothing is sent while down)."""
        self.served_inputs, self.served_outputs = list(self._expect[0]), list(self._expect[1])
        self.inputs, self.outputs = list(self._expect[0]), list(self._expect[1])
        self._wire, self._out_wire = {}, {}
        self.server_max_batch = 1
        self.precision = "not yet read"
        self.last_fault = f"unreachable at start: {why}"
        self._mark_down(self.last_fault)

    def describe(self) -> str:
        state = f" - {self.health()}" if self.down else ""
        return f"remote {self.name} at {self.endpoint.address} ({self.precision} on the wire){state}"

    # -- health -----------------------------------------------------------------------------------
    @property
    def down(self) -> bool:
        """Nothing is sent: the server was marked down and has not answered a probe since."""
        return self._state == "down"

    @property
    def in_episode(self) -> bool:
        """Down, or answering its probe again but not yet :data:`UP_AFTER` good answers in a row."""
        return self._down_since is not None

    def health(self) -> str:
        """``remote HOST:PORT up`` or ``remote HOST:PORT down since HH:MM:SS`` (until it is back)."""
        since = self._down_since
        state = "up" if since is None else f"down since {time.strftime('%H:%M:%S', time.localtime(since))}"
        return f"remote {self.endpoint.address} {state}"

    def _mark_down(self, why: str) -> None:
        """Nothing is sent from now on; a new episode says so in one line (the prober takes over)."""
        with self._lock:
            self._state = "down"
            self._goods = 0
            if self._down_since is None:
                self._down_since = time.time()
                self._episodes += 1
                log.warning("%s: %s (%s); its faces %s until it is back", self.label, self.health(), why, self.on_fault_text)
        self._wake.set()

    def _fault(self, why: str) -> None:
        """One faulted call: down after :data:`DOWN_AFTER` in a row, or at once while on trial."""
        with self._lock:
            self._faults += 1
            self._goods = 0
            trial = self._down_since is not None
            self.last_fault = why
        log.debug("%s: remote fault: %s", self.label, why)
        if trial or self._faults >= DOWN_AFTER:
            self._mark_down(why)

    def _good(self) -> None:
        """One good answer: back (one line) after :data:`UP_AFTER` in a row once it answered its probe."""
        with self._lock:
            self._faults = 0
            self._goods += 1
            since = self._down_since
            if since is None or self._state != "trial" or self._goods < UP_AFTER:
                return
            self._state, self._down_since = "up", None
        log.warning("%s: remote %s back after %.1f s", self.label, self.endpoint.address, time.time() - since)

    def _probe(self) -> None:
        """While the server is down: ask whether the model is ready, with backoff; a ready model
        puts it on trial (calls go out again; :meth:`_good` and :meth:`_fault` decide)."""
        delay = BACKOFF[0]
        while not self._closed:
            if not self.down:
                if not self.in_episode:  # the backoff grows over an episode (a server on trial that fails again)
                    delay = BACKOFF[0]
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            time.sleep(delay)
            try:
                ok = self._ready()
            except Exception:  # any failure: still down
                ok = False
            if ok:
                with self._lock:
                    if self._state == "down":
                        self._state, self._goods = "trial", 0
            else:
                delay = min(delay * 2, BACKOFF[1])

    def _ready(self) -> bool:
        """The prober's question: is the model ready? A server first reached after the start has its
        model read and checked first; one that does not fit stays down (one error line)."""
        wait = max(self.timeout, 0.5)
        if not self.described:
            try:
                self._describe_served(*self._expect, wait)
            except _Unreachable:
                return False
            except (ModelError, EngineUnavailable) as exc:
                if str(exc) != self._mismatch:
                    self._mismatch = str(exc)
                    log.error("%s (its faces still %s)", exc, self.on_fault_text)
                return False
            return True
        return bool(self.client.is_model_ready(self.name, headers=self._headers, client_timeout=wait))

    # -- calls ------------------------------------------------------------------------------------
    def input_buffers(self, n: int, shapes: dict[str, Sequence[int]] | None = None) -> dict[str, Any]:
        """Host FP32 arrays ``[:n]`` (reused across calls; CuPy arrays on a CUDA pipeline)."""
        xp = np
        if self.device == "cuda":
            import cupy as xp  # type: ignore[no-redef]
        return reused_inputs(self.inputs, self._storage, n, self.max_batch, shapes, xp)

    def _encode(self, name: str, a: np.ndarray) -> np.ndarray:
        """One input as the wire dtype; an input whose rows equal the last call's is not converted again."""
        wire = self._wire.get(name, np.dtype(np.float32))
        hit = self._cache.get(name)
        if hit is not None and hit[0].shape == a.shape and np.array_equal(hit[0], a):
            return hit[1]
        if wire == np.uint8:
            enc = np.clip(np.floor(a * self._scale + self._shift + 0.5), 0, 255).astype(np.uint8)
        else:
            enc = np.ascontiguousarray(a, dtype=wire)
        if a.ndim == 2:  # latents: small, worth remembering
            self._cache[name] = (a.copy(), enc)
        return enc

    def submit(self, feeds: dict[str, Any]) -> Any:
        """Send the call (in chunks of the server's max batch) and return a handle for :meth:`wait`
        at once. While the server is down nothing is sent; while it is on trial one call at a time
        goes out (the faces of the others get no answer at once)."""
        arrs = check_feeds(self, feeds)
        n = int(arrs[0].shape[0])
        self.calls += 1
        if type(arrs[0]).__module__.split(".")[0] == "cupy":
            arrs = [a.get() for a in arrs]
        t0 = time.perf_counter()  # the answer is waited for until t0 + timeout, not longer
        trial = self._state == "trial"
        if self.down or n == 0 or (trial and self._trials):
            return (n, [], t0, trial)
        enc = {info.name: self._encode(info.name, np.asarray(a)) for info, a in zip(self.inputs, arrs)}
        step = self.server_max_batch
        if trial:
            with self._lock:
                self._trials += 1
            n_send = min(n, step)  # one chunk: a probe with real faces
            return (n, [self._send(enc, 0, n_send, t0, trial)], t0, trial)
        return (n, [self._send(enc, lo, min(n, lo + step), t0, trial) for lo in range(0, n, step)], t0, trial)

    def _send(self, enc: dict[str, np.ndarray], lo: int, hi: int, t0: float, trial: bool) -> dict[str, Any]:
        """Rows ``lo:hi`` sent; the returned record is filled by :meth:`_judge` when the answer comes."""
        inputs = []
        for name, arr in enc.items():
            part = arr[lo:hi]
            t = self._grpc.InferInput(name, list(part.shape), _v2(part.dtype))
            t.set_data_from_numpy(np.ascontiguousarray(part))
            inputs.append(t)
        outs = [self._grpc.InferRequestedOutput(o.name) for o in self.served_outputs]
        done: dict[str, Any] = {"event": threading.Event(), "lo": lo, "hi": hi, "why": ""}

        def callback(result: Any, error: Any, done: dict[str, Any] = done) -> None:
            self._judge(done, result, error, t0, trial)

        try:
            self.client.async_infer(self.name, inputs, callback, outputs=outs, client_timeout=self.timeout, headers=self._headers)
        except Exception as exc:  # the channel refused at once
            self._judge(done, None, exc, t0, trial)
        return done

    def _judge(self, done: dict[str, Any], result: Any, error: Any, t0: float, trial: bool) -> None:
        """An answer as it comes (on gRPC's thread): ``done["rows"]`` (FP32 blocks, rows that are not
        finite made NaN) and ``done["finite"]``, or ``done["why"]``; :meth:`wait` judges it."""
        rows = done["hi"] - done["lo"]
        why = _reason(error) if error is not None else ""
        if not why:
            try:
                blocks = self._take(result, rows)
            except Exception as exc:  # ValueError naming the fault; anything else is one too
                why = str(exc) or type(exc).__name__
            else:
                finite = np.ones(rows, bool)
                for block in blocks:
                    finite &= np.isfinite(block.reshape(rows, -1)).all(axis=1)
                for block in blocks:
                    block[~finite] = np.nan
                done["rows"], done["finite"] = blocks, finite
                if not finite.all():
                    why = f"{int((~finite).sum())} of {rows} rows not finite"
        done["why"] = why
        if trial:
            with self._lock:
                self._trials -= 1
        done["event"].set()

    def wait(self, handle: Any) -> list[np.ndarray]:
        """The outputs of a :meth:`submit` (FP32), at the latest ``timeout`` after it. Rows without a
        good answer (late, refused, an error, malformed, not finite) are NaN, flagged in
        :attr:`last_bad` and counted in :attr:`failed` (and :attr:`last_failed`)."""
        n, pending, t0, trial = handle
        outs = [np.full((n, *[int(d) for d in o.shape[1:]]), np.nan, np.float32) for o in self.outputs]
        bad = np.ones(n, bool)
        deadline = t0 + self.timeout
        for done in pending:
            lo, hi = done["lo"], done["hi"]
            ok = done["event"].wait(max(0.0, deadline - time.perf_counter()))
            if ok and "rows" in done:
                for i, block in enumerate(done["rows"]):
                    outs[i][lo:hi] = block
                bad[lo:hi] = ~done["finite"]
            why = done["why"] if ok else f"no answer within {self.timeout * 1000:.0f} ms"
            if why:
                self._fault(why)
            else:
                self._good()
        self.last_bad = bad
        self.last_failed = int(bad.sum())
        self.failed += self.last_failed
        if self.device == "cuda":
            import cupy

            return [cupy.asarray(o) for o in outs]
        return outs

    def _take(self, res: Any, rows: int) -> list[np.ndarray]:
        """Each output of an answer as FP32 ``(rows, *item)``; ValueError naming what is wrong with it."""
        if res is None:
            raise ValueError("an empty answer")
        got = []
        for o in self.outputs:
            item = tuple(int(d) for d in o.shape[1:])
            head = res.get_output(o.name)
            if head is None:
                raise ValueError(f"no output '{o.name}' in the answer")
            want = self._out_wire.get(o.name, "FP32")
            if head.datatype != want:
                raise ValueError(f"output '{o.name}' is {head.datatype}, expected {want}")
            try:
                arr = res.as_numpy(o.name)
            except Exception as exc:  # short or long data, a bad shape: whatever the decoder says
                raise ValueError(f"output '{o.name}' unreadable: {_reason(exc)}") from None
            if arr is None or arr.dtype.kind not in "fiu" or tuple(arr.shape) != (rows, *item):
                shape = None if arr is None else tuple(arr.shape)
                raise ValueError(f"output '{o.name}' has shape {shape}, expected {(rows, *item)}")
            got.append(np.array(arr, np.float32))  # a copy: the decoder's array is the reply's buffer
        return got

    def run(self, feeds: dict[str, Any]) -> list[np.ndarray]:
        return self.wait(self.submit(feeds))

    def run_device(self, feeds: dict[str, Any], stream: Any = None) -> list[Any]:
        return self.run(feeds)

    def statistics(self) -> dict[str, int]:
        """The server's cumulative counts for this model (:func:`_model_counts`)."""
        stats = self.client.get_inference_statistics(self.name, headers=self._headers, as_json=True)
        return _model_counts(stats["model_stats"][0])

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        try:
            self.client.close()
        except Exception:  # closing is best effort
            pass

    def __repr__(self) -> str:
        return f"RemoteEngine({self.name!r}, {self.describe()})"


def _model_counts(row: dict[str, Any]) -> dict[str, int]:
    """One model's row of Triton's statistics: ``requests`` (inference count) and ``executions``;
    ``answered`` requests and their nanoseconds on the server: ``success_ns`` (arrival to answer,
    queue and batch included), ``queue_ns`` and ``compute_ns`` (input, inference, output)."""
    times = row.get("inference_stats", {})

    def ns(*keys: str) -> int:
        return sum(int(times.get(k, {}).get("ns", 0)) for k in keys)

    return {
        "requests": int(row.get("inference_count", 0)),
        "executions": int(row.get("execution_count", 0)),
        "answered": int(times.get("success", {}).get("count", 0)),
        "success_ns": ns("success"),
        "queue_ns": ns("queue"),
        "compute_ns": ns("compute_input", "compute_infer", "compute_output"),
    }


def _channel_args(grpcclient: Any) -> list[tuple[str, int]]:
    """tritonclient's channel settings, with gRPC's reconnection backoff bounded (its own grows to
    two minutes: a server back after an outage would wait that long to be dialled again)."""
    keep = grpcclient.KeepAliveOptions()
    size = grpcclient.MAX_GRPC_MESSAGE_SIZE
    return [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", size),
        ("grpc.keepalive_time_ms", keep.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keep.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keep.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keep.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", int(BACKOFF[0] * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(BACKOFF[0] * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(BACKOFF[1] * 1000)),
    ]


def _v2(dtype: np.dtype) -> str:
    return next(k for k, v in V2_DTYPES.items() if np.dtype(v) == np.dtype(dtype))


def _reason(err: Any) -> str:
    msg = getattr(err, "message", None)
    text = msg() if callable(msg) else str(err)
    return (text or type(err).__name__).strip().splitlines()[0][:160]


__all__ = ["BACKOFF", "DOWN_AFTER", "UP_AFTER", "Endpoint", "RemoteEngine", "V2_DTYPES", "parse_url"]
