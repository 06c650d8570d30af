"""The ``remote`` backend: a model served by a KServe V2 server (NVIDIA Triton, PyTriton's Triton,
KServe, MLServer) over gRPC, through ``tritonclient.grpc`` (``pip install 'fastswap-cam[remote]'``).

Never picked by ``auto``: faces leave the machine only when a role's config says so
(``[engines.swapper] backend = "remote"``). The engine is built directly, not by
:func:`~vcam.engines.create_engine`, since it needs a URL and credentials rather than a file.

- **Start**: the served model's inputs, outputs, dtypes and max batch are read from the server and
  checked against ``expect`` (the local model's description); a mismatch is one line naming both.
  ``inputs`` are the local description (FP32, as the stages write them); what goes on the wire is
  the served dtype: uint8 crops where the served model takes uint8 (``vcam serve export
  --uint8-input`` puts the cast in the model), else FP16 or FP32 as served.
- **Calls**: :meth:`RemoteEngine.submit` sends (``async_infer``, chunks of the server's max batch)
  and returns at once; :meth:`RemoteEngine.wait` takes the answer. :meth:`run_device` is both. The
  encoded rows of an input that did not change since the last call (the source latents: they change
  on a face switch only) are reused, not converted again.
- **Faults never block**: a call that times out or finds the server gone returns NaN outputs (the
  swapper's NaN guard then passes those faces through unswapped and counts them), marks the
  server down with the time, and a background thread polls it with backoff; while it is down no
  call is sent (no frame waits on a dead server). :meth:`health` says
  ``remote HOST:PORT down since HH:MM:SS``.
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
#: Seconds between reconnection attempts: doubling from the first to the last.
BACKOFF = (0.25, 1.0)


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
    item dims; the batch dim is the server's); ``timeout``: seconds a call may take before its
    faces pass through; ``pixel_scale``/``pixel_shift``: how a uint8 wire input relates to the FP32
    input the stages write (``u8 = x * scale + shift``, per channel; default: ``x * 255``);
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
        )
        self._grpc = grpcclient
        #: Where the caller's arrays live: on "cuda" the input buffers are CuPy arrays and the
        #: outputs are handed back as CuPy (the wire is host memory either way).
        self.device = "cuda" if device == "cuda" else "cpu"
        self._scale = np.asarray(pixel_scale, np.float32).reshape(1, -1, 1, 1)
        self._shift = np.asarray(pixel_shift, np.float32).reshape(1, -1, 1, 1)
        self._lock = threading.Lock()
        self._down_since: float | None = None  # wall clock of the first failure of this outage
        self._down_why = ""
        self._wake = threading.Event()
        self._closed = False
        self.failed = 0  # items that passed through because the server did not answer
        self.last_failed = 0  # items of the last wait() that did
        self.calls = 0
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # input -> (rows sent, encoded rows)
        self._storage: dict[tuple, np.ndarray] = {}
        self._describe_served(expect, expect_outputs, connect_timeout)
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
            raise EngineUnavailable(
                f"{where}: {msg}", hint="start the server (vcam serve) or fix [engines.swapper] url and model"
            ) from None
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
        self.server_max_batch = served_max if served_max > 0 else 1
        self.precision = "uint8" if np.dtype(np.uint8) in self._wire.values() else str(self.served_inputs[0].dtype)
        log.info("%s: %s (max batch %d)", self.label, self.describe(), self.server_max_batch)

    def describe(self) -> str:
        state = f" - {self.health()}" if self.down else ""
        return f"remote {self.name} at {self.endpoint.address} ({self.precision} on the wire){state}"

    # -- health -----------------------------------------------------------------------------------
    @property
    def down(self) -> bool:
        return self._down_since is not None

    def health(self) -> str:
        """``remote HOST:PORT up`` or ``remote HOST:PORT down since HH:MM:SS``."""
        since = self._down_since
        state = "up" if since is None else f"down since {time.strftime('%H:%M:%S', time.localtime(since))}"
        return f"remote {self.endpoint.address} {state}"

    def _mark_down(self, why: str) -> None:
        with self._lock:
            if self._down_since is None:
                self._down_since = time.time()
                self._down_why = why
                log.warning("%s: %s (%s); faces pass through until it answers", self.label, self.health(), why)
        self._wake.set()

    def _probe(self) -> None:
        """While the server is down: ask whether the model is ready, with backoff; up again ends it."""
        delay = BACKOFF[0]
        while not self._closed:
            if not self.down:
                delay = BACKOFF[0]
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            time.sleep(delay)
            try:
                ok = self.client.is_model_ready(self.name, headers=self._headers, client_timeout=max(self.timeout, 0.5))
            except Exception:  # any failure: still down
                ok = False
            if ok:
                with self._lock:
                    since, self._down_since = self._down_since, None
                log.warning("%s: remote %s back after %.1f s", self.label, self.endpoint.address, time.time() - (since or 0))
            else:
                delay = min(delay * 2, BACKOFF[1])

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
        at once. While the server is down nothing is sent."""
        arrs = check_feeds(self, feeds)
        n = int(arrs[0].shape[0])
        self.calls += 1
        if type(arrs[0]).__module__.split(".")[0] == "cupy":
            arrs = [a.get() for a in arrs]
        if self.down or n == 0:
            return (n, [])
        enc = {info.name: self._encode(info.name, np.asarray(a)) for info, a in zip(self.inputs, arrs)}
        pending = []
        step = self.server_max_batch
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            inputs = []
            for name, arr in enc.items():
                part = arr[lo:hi]
                t = self._grpc.InferInput(name, list(part.shape), _v2(part.dtype))
                t.set_data_from_numpy(np.ascontiguousarray(part))
                inputs.append(t)
            outs = [self._grpc.InferRequestedOutput(o.name) for o in self.served_outputs]
            done: dict[str, Any] = {"event": threading.Event(), "lo": lo, "hi": hi}

            def callback(result: Any, error: Any, done: dict[str, Any] = done) -> None:
                done["result"], done["error"] = result, error
                done["event"].set()

            try:
                self.client.async_infer(
                    self.name, inputs, callback, outputs=outs, client_timeout=self.timeout, headers=self._headers
                )
            except Exception as exc:  # the channel refused at once
                done["error"] = exc
                done["event"].set()
            pending.append(done)
        return (n, pending)

    def wait(self, handle: Any) -> list[np.ndarray]:
        """The outputs of a :meth:`submit` (FP32). Rows whose call failed are NaN and counted in
        :attr:`failed` (and :attr:`last_failed`)."""
        n, pending = handle
        outs = [np.full((n, *[int(d) for d in o.shape[1:]]), np.nan, np.float32) for o in self.outputs]
        failed = n if not pending else 0
        deadline = time.perf_counter() + self.timeout + 0.05
        for done in pending:
            ok = done["event"].wait(max(0.0, deadline - time.perf_counter()))
            err = done.get("error") if ok else TimeoutError(f"no answer within {self.timeout * 1000:.0f} ms")
            if err is None and done.get("result") is not None:
                res = done["result"]
                for i, o in enumerate(self.outputs):
                    outs[i][done["lo"] : done["hi"]] = res.as_numpy(o.name)
                continue
            failed += done["hi"] - done["lo"]
            self._mark_down(_reason(err))
        self.last_failed = failed
        self.failed += failed
        if self.device == "cuda":
            import cupy

            return [cupy.asarray(o) for o in outs]
        return outs

    def run(self, feeds: dict[str, Any]) -> list[np.ndarray]:
        return self.wait(self.submit(feeds))

    def run_device(self, feeds: dict[str, Any], stream: Any = None) -> list[Any]:
        return self.run(feeds)

    def statistics(self) -> dict[str, int]:
        """The server's counts for this model: ``requests`` (inference count) and ``executions``."""
        stats = self.client.get_inference_statistics(self.name, headers=self._headers, as_json=True)
        row = stats["model_stats"][0]
        return {"requests": int(row.get("inference_count", 0)), "executions": int(row.get("execution_count", 0))}

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        try:
            self.client.close()
        except Exception:  # closing is best effort
            pass

    def __repr__(self) -> str:
        return f"RemoteEngine({self.name!r}, {self.describe()})"


def _v2(dtype: np.dtype) -> str:
    return next(k for k, v in V2_DTYPES.items() if np.dtype(v) == np.dtype(dtype))


def _reason(err: Any) -> str:
    msg = getattr(err, "message", None)
    text = msg() if callable(msg) else str(err)
    return (text or type(err).__name__).strip().splitlines()[0][:160]


__all__ = ["BACKOFF", "Endpoint", "RemoteEngine", "V2_DTYPES", "parse_url"]
