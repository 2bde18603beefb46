"""`specbench serve`'s settings and what guards its door: the config (bounds, and no bind beyond
loopback without credentials), the TLS context, and whether a client is on this machine."""
from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass, field

from websockets.asyncio.server import ServerConnection

from specdec.errors import ConfigError


@dataclass(frozen=True)
class ServeConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind; anything but loopback needs --token-file"})
    port: int = field(default=0, metadata={"help": "TCP port; 0 picks a free one"})
    max_sessions: int = field(default=16, metadata={"help": "open sessions at most; one more is refused"})
    session_ttl_s: float = field(default=300.0, metadata={"help": "free a session after this many idle seconds"})
    max_message_mb: float = field(default=64.0, metadata={"help": "largest message accepted (MiB)"})
    token: str | None = field(default=None, metadata={"help": "shared secret every session must present"})
    max_batch: int = field(default=16, metadata={"help": "verify requests of different sessions run as one forward, at most "
                                                          "this many (1: unbatched)"})
    batch_window_ms: float = field(default=0.0, metadata={"help": "wait this long for more requests before a forward (0: batch "
                                                                  "only what already queued)"})
    max_connections: int = field(default=256, metadata={"help": "open connections at most; one more is refused at once"})
    idle_timeout_s: float = field(default=30.0, metadata={"help": "close a connection that holds no session after this many "
                                                                  "idle seconds"})
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
    hello_timeout_s: float = 10.0

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
