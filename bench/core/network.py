"""The network an escalation crosses: each cloud call costs
    RTT + uplink_bytes * 8 / uplink_bps + downlink_bytes * 8 / downlink_bps
(one request/response on an already open connection; no slow start, no loss). Bytes come from what
would really cross, computed from a results trace after the run: the engine never sleeps for it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from specdec.errors import ConfigError

# Per message (request or response): session id, positions, lengths, a status, length-prefixed
# framing of a small binary RPC. An assumption; TCP/IP/TLS framing on a kept-alive stream ignored.
HEADER_BYTES = 64
TOKEN_BYTES = 4  # one int32 token id; vocabularies of ~150k ids need more than 16 bits


# Past these a link is a typo, not a network (`--rtt 1e9s` held every call for 32 years, `--up
# 1e-30mbit` one byte for ages): a geostationary hop is 0.6 s, a 2G uplink tens of kbit/s.
MAX_RTT_S = 60.0
MIN_RATE_BPS = 1e3


@dataclass(frozen=True)
class NetworkProfile:
    name: str
    rtt_s: float  # round-trip time, edge -> cloud -> edge, seconds
    uplink_bps: float  # edge -> cloud, bits per second (math.inf: free)
    downlink_bps: float  # cloud -> edge, bits per second (math.inf: free)

    def __post_init__(self) -> None:
        if not (self.rtt_s >= 0 and math.isfinite(self.rtt_s)):
            raise ConfigError(f"network {self.name!r}: rtt_s must be a finite number >= 0, got {self.rtt_s}")
        if self.rtt_s > MAX_RTT_S:
            raise ConfigError(f"network {self.name!r}: an rtt of {self.rtt_s:g} s is beyond any network "
                              f"(at most {MAX_RTT_S:g} s; did you mean ms?)")
        for field in ("uplink_bps", "downlink_bps"):
            if not getattr(self, field) > 0:
                raise ConfigError(f"network {self.name!r}: {field} must be > 0 (math.inf for free), got {getattr(self, field)}")
            if getattr(self, field) < MIN_RATE_BPS:
                raise ConfigError(f"network {self.name!r}: {field} {getattr(self, field):g} bit/s is below any network "
                                  f"(at least {MIN_RATE_BPS:g} bit/s, i.e. 1kbit)")

    def transfer_s(self, uplink_bytes: int, downlink_bytes: int) -> float:
        """Seconds for one call that sends `uplink_bytes` and receives `downlink_bytes`."""
        return self.rtt_s + 8 * uplink_bytes / self.uplink_bps + 8 * downlink_bytes / self.downlink_bps


MBIT = 1e6
# No network: the cloud is free to reach (the engine's own numbers). A link is an open format (a preset's name or
# rtt=...,up=...,down=...), so this one name is the sentinel code compares a link with: a link at it is not shaped.
NO_LINK = "none"
PRESETS = {
    NO_LINK: NetworkProfile(NO_LINK, 0.0, math.inf, math.inf),
    # Home Wi-Fi on fixed broadband. Ookla Speedtest Global Index (2024): global median fixed
    # download ≈ 94 Mbit/s, upload ≈ 40–45 Mbit/s; Ookla market reports (2023) give fixed-line
    # multi-server latency medians of ≈ 10–15 ms, plus the Wi-Fi hop and a regional cloud: 20 ms.
    "wifi": NetworkProfile("wifi", 0.020, 40 * MBIT, 90 * MBIT),
    # LTE. Opensignal, State of Mobile: USA (May 2019): 4G download 21.3 Mbit/s, upload
    # 6.3 Mbit/s, latency 44–66 ms.
    "4g": NetworkProfile("4g", 0.050, 6 * MBIT, 20 * MBIT),
    # 5G (non-standalone, mid-band). Ookla, "Growing and Slowing: The State of 5G Worldwide in
    # 2021" (Q3 2021): global median 5G download 166 Mbit/s, upload 21 Mbit/s. Latency: Opensignal
    # (2020–2022) found early 5G only slightly below 4G end to end; 3GPP TR 38.913's 4 ms eMBB
    # target is the radio user plane alone. 30 ms.
    "5g": NetworkProfile("5g", 0.030, 20 * MBIT, 160 * MBIT),
}

_TIME_UNITS = {"ms": 1e-3, "s": 1.0}
_RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_SPEC_KEYS = {"rtt": "rtt_s", "up": "uplink_bps", "down": "downlink_bps"}
_VALUE_RE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]+)(?:/s)?\s*")
_SPEC_HELP = "write e.g. 'rtt=40ms,up=10mbit,down=50mbit' (rtt in ms|s, rates in kbit|mbit|gbit per second)"


def _parse_value(key: str, text: str, spec: str) -> float:
    units = _TIME_UNITS if key == "rtt" else _RATE_UNITS
    match = _VALUE_RE.fullmatch(text.lower())
    if not match or match[2] not in units:
        raise ConfigError(f"network spec {spec!r}: bad {key} value {text!r}, need a number with a unit in {'|'.join(units)}")
    return float(match[1]) * units[match[2]]


def profile(name_or_spec: str) -> NetworkProfile:
    """A preset by name (`none`, `wifi`, `4g`, `5g`) or a custom `rtt=40ms,up=10mbit,down=50mbit`."""
    spec = name_or_spec.strip()
    if "=" not in spec:
        if spec.lower() in PRESETS:
            return PRESETS[spec.lower()]
        raise ConfigError(f"unknown network {spec!r}: use one of {', '.join(PRESETS)}, or {_SPEC_HELP}")
    values: dict[str, float] = {}
    for part in spec.split(","):
        key, sep, text = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in _SPEC_KEYS:
            raise ConfigError(f"network spec {spec!r}: bad field {part.strip()!r}, keys are rtt, up, down; {_SPEC_HELP}")
        if _SPEC_KEYS[key] in values:
            raise ConfigError(f"network spec {spec!r}: {key} given twice; {_SPEC_HELP}")
        values[_SPEC_KEYS[key]] = _parse_value(key, text, spec)
    missing = [key for key, field in _SPEC_KEYS.items() if field not in values]
    if missing:
        raise ConfigError(f"network spec {spec!r}: missing {', '.join(missing)}; {_SPEC_HELP}")
    return NetworkProfile(spec, **values)


def escalation_bytes(
    tokens_in: int, features_bytes: int, returned_tokens: int, bytes_per_token: int = TOKEN_BYTES
) -> tuple[int, int]:
    """(uplink, downlink) bytes of one cloud call.
    uplink: `tokens_in` ids (unseen accepted + draft) + `features_bytes` (0 when not sent) + header;
    downlink: `returned_tokens` ids/ints + header."""
    if min(tokens_in, features_bytes, returned_tokens) < 0 or bytes_per_token < 1:
        raise ConfigError(
            f"escalation_bytes: counts must be >= 0 and bytes_per_token >= 1, got "
            f"{tokens_in=}, {features_bytes=}, {returned_tokens=}, {bytes_per_token=}"
        )
    uplink = tokens_in * bytes_per_token + features_bytes + HEADER_BYTES
    return uplink, returned_tokens * bytes_per_token + HEADER_BYTES


@dataclass(frozen=True)
class NetworkCost:
    latency_s: float  # summed over calls: the calls are sequential, each blocks the edge
    uplink_bytes: int
    downlink_bytes: int
    calls: int


def network_cost(trace_cycles: list[dict], profile: NetworkProfile, features_bytes: int) -> NetworkCost:
    """Network cost of the escalated cycles of one results trace (`result_record(...)["trace"]`).
    `features_bytes`: size of the prompt's audio features, counted on calls with `sent_features`
    (the first call of a cached verifier session, every call of the stateless one).
    The reply carries the accepted count (one int) plus the correction/bonus id if any: the edge
    already holds the draft, so accepted ids need not come back."""
    latency_s, uplink_total, downlink_total, calls = 0.0, 0, 0, 0
    for cycle in trace_cycles:
        if not cycle["escalated"]:
            continue
        uplink, downlink = escalation_bytes(
            tokens_in=cycle["cloud_tokens_in"],
            features_bytes=features_bytes if cycle["sent_features"] else 0,
            returned_tokens=1 + (cycle["extra_kind"] is not None),
        )
        latency_s += profile.transfer_s(uplink, downlink)
        uplink_total, downlink_total, calls = uplink_total + uplink, downlink_total + downlink, calls + 1
    return NetworkCost(latency_s, uplink_total, downlink_total, calls)


def network_latency_s(trace_cycles: list[dict], profile: NetworkProfile, features_bytes: int) -> float:
    """Seconds the network adds to one generation (see `network_cost`)."""
    return network_cost(trace_cycles, profile, features_bytes).latency_s
