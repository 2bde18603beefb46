"""`specbench serve`'s settings and what guards its door: the config (bounds, and no bind beyond
loopback without credentials), the TLS context, and whether a client is on this machine."""
from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass, field

from websockets.asyncio.server import ServerConnection

from specdec.backends.base import DTYPES
from specdec.backends.devices import CUDA_GRAPHS, SERVER_CACHES, check_served_cache, check_served_device
from specdec.errors import ConfigError
from specdec.models.loading import LoadSettings
from specdec.runtime_registry import RuntimeChoices, canonical_runtime, default_runtime, runtimes, served_runtime
from specdec.settings import CudaGraphs, DType, KVCache, ServerCache, parse, parse_fields


@dataclass(frozen=True)
class ServedModel:
    """What a server runs, checked where its flags are read: the model, its runtime (resolved as a server resolves
    it), and for the torch runtime its dtype, device, KV cache and captured graphs."""

    model: str = field(metadata={"help": "cloud model: registry alias or local directory (arch:PATH.json: a "
                                         "random-weight architecture, for timing with --follow-verdicts)"})
    dtype: DType = field(default=DType.BFLOAT16, metadata={"help": "the torch runtime's dtype", "choices": tuple(DTYPES)})
    runtime: str | None = field(default=None, metadata={
        "help": "what runs the model: " + "; ".join(f"{r.name}: {r.summary}" for r in runtimes())
                + f". Default: the runtime a model file needs (a .gguf path's), else {default_runtime()}",
        "choices": RuntimeChoices(), "canonical": canonical_runtime})
    device: str = field(default="cpu", metadata={"help": "where the torch model runs: cpu, cuda or cuda:N "
                                                         "(docs/gpu.md); the other runtimes: cpu only",
                                                 "flags": ("--cloud-device",)})
    kv_cache: ServerCache = field(default=ServerCache.AUTO, metadata={
        "help": "the torch model's KV cache: dynamic (transformers' DynamicCache; each forward pads its rows' caches "
                "into one), static (one preallocated cache of --max-sessions sequences, each row at its own "
                "positions; on CUDA its forwards replay as captured graphs: docs/gpu.md) or auto (default: static on "
                "CUDA for the decoders it runs, dynamic on the CPU)", "choices": SERVER_CACHES})
    cuda_graphs: CudaGraphs = field(default=CudaGraphs.ON, metadata={
        "help": "on CUDA with --kv-cache static: replay forwards of up to 16 tokens as CUDA graphs (on) or run them "
                "eagerly (off)", "choices": CUDA_GRAPHS})

    def __post_init__(self) -> None:
        parse_fields(self)
        runtime = served_runtime(self.model, self.runtime)
        object.__setattr__(self, "runtime", runtime)
        check_served_device(self.device, runtime)
        check_served_cache(self.kv_cache, runtime)

    def load_settings(self, sessions: int) -> LoadSettings:
        """How the model loads: its runtime's, and for a static cache room for `sessions` interleaved sequences."""
        return LoadSettings(self.dtype, served_runtime(self.model, self.runtime), self.device,
                            parse(KVCache, self.kv_cache, "kv_cache"), self.cuda_graphs, sessions=sessions)


@dataclass(frozen=True)
class ServeConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind; anything but loopback needs --token-file"})
    port: int = field(default=0, metadata={"help": "TCP port; 0 picks a free one"})
    max_sessions: int = field(default=16, metadata={"help": "open sessions at most; one more is refused"})
    session_ttl_s: float = field(default=300.0, metadata={"help": "free a session after this many idle seconds",
                                                          "flags": ("--session-ttl",)})
    max_message_mb: float = field(default=64.0, metadata={"help": "largest message accepted (MiB)"})
    token: str | None = field(default=None, metadata={"help": "shared secret every session must present (serve reads it "
                                                              "from --token-file)", "flag": False})
    max_batch: int = field(default=16, metadata={"help": "verify requests of different sessions run as one forward, at most "
                                                          "this many (1: unbatched)"})
    batch_window_ms: float = field(default=0.0, metadata={"help": "wait this long for more requests before a forward, less once "
                                                                  "every open connection has one in (0: batch only what "
                                                                  "already queued)"})
    max_connections: int = field(default=256, metadata={"help": "open connections at most; one more is refused at once"})
    idle_timeout_s: float = field(default=30.0, metadata={"help": "close a connection that holds no session after this many "
                                                                  "idle seconds", "flags": ("--idle-timeout",)})
    max_sessions_per_client: int | None = field(default=None, metadata={"help": "open sessions per client address at most "
                                                                                "(default: --max-sessions)"})
    share_stats: bool = field(default=False, metadata={"help": "`stats` shows every client the whole batch log (default: "
                                                              "only the forwards that served the asking client's address)"})
    follow_verdicts: bool = field(default=False, metadata={
        "help": "a verify may carry the verdict to keep (`verify.follow`): the server computes its own, counts whether "
                "it agreed, and keeps the given one. For timing a random-weight architecture of the real size with "
                "recorded edges (`fleet --edge-replay --follow-verdicts`, docs/gpu.md); refused unless set"})
    tls_cert: str | None = field(default=None, metadata={"help": "PEM certificate: serve wss:// (TLS) instead of ws://"})
    tls_key: str | None = field(default=None, metadata={"help": "PEM private key of --tls-cert"})
    hello_timeout_s: float = field(default=10.0, metadata={"flag": False})  # a client's first message, at most

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.max_sessions < 1:
            raise ConfigError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if not self.session_ttl_s > 0:
            raise ConfigError(f"session_ttl_s must be > 0 seconds, got {self.session_ttl_s}")
        if self.max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1, got {self.max_connections}")
        if not self.idle_timeout_s > 0:
            raise ConfigError(f"idle_timeout_s must be > 0 seconds, got {self.idle_timeout_s}")
        if self.max_sessions_per_client is not None and self.max_sessions_per_client < 1:
            raise ConfigError(f"max_sessions_per_client must be >= 1 (or unset), got {self.max_sessions_per_client}")
        if self.max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1 (1 = unbatched), got {self.max_batch}")
        if not 0 <= self.batch_window_ms <= 1000:
            raise ConfigError(f"batch_window_ms must be in [0, 1000] ms, got {self.batch_window_ms}")
        if not self.max_message_mb > 0:
            raise ConfigError(f"max_message_mb must be > 0, got {self.max_message_mb}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both --tls-cert and --tls-key (PEM files), or neither")
        if not is_loopback(self.host) and not self.token:
            raise ConfigError(
                f"refusing to bind {self.host}: only loopback is served without credentials; "
                "give --token-file FILE (a shared secret) or bind 127.0.0.1"
            )


def server_tls(config: ServeConfig) -> ssl.SSLContext | None:
    """The TLS context of --tls-cert/--tls-key, or None for plain ws:// (a bad file is one line)."""
    if config.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"cannot load the TLS certificate {config.tls_cert} with key {config.tls_key}: "
                          f"{getattr(e, 'strerror', None) or e}; give PEM files that belong together") from None
    return context


def client_address(ws: ServerConnection) -> str:
    address = ws.remote_address
    return str(address[0]) if address else "unknown"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
