"""Scenarios and the workload they generate (arrivals, sizes, stalls, crashes).

A :class:`Scenario` is a plain description of a fleet and its traffic. A
:class:`Workload` is what one seed makes of it: every request's arrival time,
KV size and service times, and every decode engine's forward-pass stalls. All
policies of one comparison run on the same :class:`Workload`, so their figures
differ only by what the policy does.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

__all__ = ["PRESETS", "Crash", "Hang", "Scenario", "Surge", "Workload", "generate", "preset"]


@dataclass(frozen=True)
class Surge:
    """Extra arrivals: ``rate`` requests/s on top of the steady rate, for
    ``length`` seconds from ``start``."""

    start: float
    length: float
    rate: float


@dataclass(frozen=True)
class Crash:
    """Decode engine ``engine`` dies at ``at`` (losing its queue, running set and
    heartbeat state) and comes back empty ``down_for`` seconds later."""

    at: float
    engine: int
    down_for: float = 60.0


@dataclass(frozen=True)
class Hang:
    """Decode engine ``engine`` admits nothing from its waiting queue for
    ``length`` seconds from ``at`` while it keeps stepping and heartbeating (a
    stuck running set): P's leases stay renewed although nobody reads them."""

    at: float
    engine: int
    length: float


@dataclass(frozen=True)
class Scenario:
    """A fleet and its traffic. Times in seconds of virtual time."""

    name: str = "custom"
    #: arrivals window; the run continues after it until everything is released
    duration: float = 600.0
    #: steady Poisson arrival rate, requests/s
    rate: float = 1.0
    surges: tuple[Surge, ...] = ()
    crashes: tuple[Crash, ...] = ()
    hangs: tuple[Hang, ...] = ()
    p_engines: int = 2
    d_engines: int = 2
    #: D's running-set capacity (concurrent decodes per engine)
    d_slots: int = 16
    #: prompt length range, tokens (uniform); KV blocks = ceil(tokens / block_tokens)
    prompt_tokens: tuple[int, int] = (256, 4096)
    block_tokens: int = 16
    #: prefill seconds = prefill_base + tokens * prefill_per_token (one at a time per P)
    prefill_base: float = 0.02
    prefill_per_token: float = 5e-5
    #: output length range, tokens (uniform); decode seconds = tokens * decode_per_token
    output_tokens: tuple[int, int] = (100, 600)
    decode_per_token: float = 0.04
    #: KV read seconds = read_base + blocks * read_per_block
    read_base: float = 0.005
    read_per_block: float = 2e-5
    #: forward-pass step of D and P engines (P handles notifications and expiry once a step)
    d_step: float = 0.05
    p_step: float = 0.02
    #: D forward-pass stalls: Poisson rate per engine-second, length uniform in stall_len
    stall_rate: float = 0.005
    stall_len: tuple[float, float] = (0.5, 3.0)
    #: one-way notification delay: delay_base + uniform(0, delay_jitter)
    delay_base: float = 0.002
    delay_jitter: float = 0.05
    #: router transit from P's grant to D's waiting queue
    router_transit: float = 0.01
    #: D's proactive handshake with a P engine it has not talked to yet
    handshake: float = 0.2
    #: how long the router keeps sending to a dead D before it notices
    router_detect: float = 2.0

    def __post_init__(self) -> None:
        for key in (
            "duration",
            "rate",
            "d_step",
            "p_step",
            "prefill_per_token",
            "decode_per_token",
            "block_tokens",
        ):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"scenario {key}={value!r} must be a positive finite number")
        for key in ("p_engines", "d_engines", "d_slots"):
            if getattr(self, key) < 1:
                raise ValueError(f"scenario {key} must be >= 1")
        for key in (
            "stall_rate",
            "delay_base",
            "delay_jitter",
            "router_transit",
            "handshake",
            "router_detect",
            "prefill_base",
            "read_base",
            "read_per_block",
        ):
            if getattr(self, key) < 0:
                raise ValueError(f"scenario {key} must be >= 0")
        for crash in self.crashes:
            if not 0 <= crash.engine < self.d_engines:
                raise ValueError(
                    f"crash names decode engine {crash.engine}, but there are {self.d_engines}"
                )
            if crash.down_for <= 0:
                raise ValueError("crash down_for must be > 0")
        for hang in self.hangs:
            if not 0 <= hang.engine < self.d_engines or hang.length <= 0:
                raise ValueError(f"hang {hang!r}: no such decode engine, or length <= 0")
        for s in self.surges:
            if s.length <= 0 or s.rate < 0:
                raise ValueError("surge length must be > 0 and rate >= 0")

    @property
    def max_stall(self) -> float:
        """Bound on the gap between two D steps (S_D): a stall plus one step."""
        return self.d_step + (self.stall_len[1] if self.stall_rate > 0 else 0.0)

    @property
    def max_delay(self) -> float:
        """Bound on one-way notification delay (δ)."""
        return self.delay_base + self.delay_jitter


_SURGE = Scenario(
    name="surge",
    duration=900.0,
    rate=1.0,
    surges=(Surge(start=120.0, length=120.0, rate=3.0),),
)
_CRASH = Scenario(
    # A short burst from t=160 leaves queued requests on every D when D0 dies.
    name="crash",
    duration=600.0,
    rate=3.0,
    d_engines=4,
    surges=(Surge(start=160.0, length=40.0, rate=4.0),),
    crashes=(Crash(at=200.0, engine=0, down_for=60.0),),
)
_BOTH = Scenario(
    name="both",
    duration=900.0,
    rate=1.0,
    surges=(Surge(start=120.0, length=120.0, rate=3.0),),
    crashes=(Crash(at=200.0, engine=0, down_for=60.0),),
)
_SCALE = Scenario(
    name="scale",
    duration=3600.0,
    rate=2.9,
    p_engines=4,
    d_engines=8,
    surges=(Surge(start=900.0, length=300.0, rate=8.0),),
    crashes=(Crash(at=1100.0, engine=0, down_for=120.0), Crash(at=2700.0, engine=3, down_for=60.0)),
)

_H = 3600.0
_INTERNET = Scenario(
    # A day of traffic for a large fleet: 1.0 M requests over 100 P and 200 D engines.
    # 11 requests/s all day against a decode capacity of about 18/s (4 running slots per
    # D, 200-2,000 output tokens at 25 tokens/s: 44 s each on average); a morning peak
    # at 18/s and an evening one at 19/s fill D's waiting queues (minutes of wait at
    # their ends). Seven D crashes: one at night, two in each peak while the queues are
    # full, one as the evening queues drain, one after.
    name="internet",
    duration=24 * _H,
    rate=11.0,
    p_engines=100,
    d_engines=200,
    d_slots=4,
    output_tokens=(200, 2000),
    surges=(
        Surge(start=10 * _H, length=_H, rate=7.0),
        Surge(start=19 * _H, length=_H, rate=8.0),
    ),
    crashes=(
        Crash(at=3 * _H, engine=0, down_for=300.0),
        Crash(at=10.75 * _H, engine=17, down_for=120.0),
        Crash(at=10.9 * _H, engine=42, down_for=300.0),
        Crash(at=19.7 * _H, engine=101, down_for=600.0),
        Crash(at=19.9 * _H, engine=150, down_for=120.0),
        Crash(at=20.2 * _H, engine=199, down_for=300.0),
        Crash(at=22 * _H, engine=77, down_for=300.0),
    ),
)

_HANG = Scenario(
    name="hang",
    duration=600.0,
    rate=1.0,
    hangs=(Hang(at=100.0, engine=0, length=600.0),),
)

#: The design document's scenarios (surge, crash, both), two at scale (an hour of a
#: small fleet; a day of a large one), and a stuck-but-heartbeating D (what a
#: lifetime cap is for).
PRESETS: dict[str, Scenario] = {
    s.name: s for s in (_SURGE, _CRASH, _BOTH, _SCALE, _INTERNET, _HANG)
}


def preset(name: str, **overrides: object) -> Scenario:
    """A preset with some fields replaced (``ValueError`` for an unknown name)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)  # type: ignore[arg-type]


@dataclass
class Workload:
    """One seed's draw of a :class:`Scenario`. Request ``i`` is described by
    the ``i``-th element of every list."""

    scenario: Scenario
    seed: int
    rid: list[str] = field(default_factory=list)
    arrival: list[float] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    prefill_s: list[float] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)
    #: per decode engine: sorted, disjoint stall windows (start, end)
    stalls: list[list[tuple[float, float]]] = field(default_factory=list)
    #: per engine (P engines first, then D): phase of its step grid
    p_phase: list[float] = field(default_factory=list)
    d_phase: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.arrival)


def _rate_at(sc: Scenario, t: float) -> float:
    return sc.rate + sum(s.rate for s in sc.surges if s.start <= t < s.start + s.length)


def _arrivals(sc: Scenario, rng: random.Random) -> list[float]:
    # Thinning (Lewis-Shedler) over the piecewise-constant rate.
    top = sc.rate + sum(s.rate for s in sc.surges)
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= sc.duration:
            return out
        if rng.random() * top < _rate_at(sc, t):
            out.append(t)


def _stalls(sc: Scenario, rng: random.Random, horizon: float) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    if sc.stall_rate <= 0:
        return out
    t = 0.0
    while True:
        t += rng.expovariate(sc.stall_rate)
        if t >= horizon:
            return out
        start = math.floor(t / sc.d_step) * sc.d_step
        end = start + rng.uniform(*sc.stall_len)
        if out and start <= out[-1][1]:
            continue  # keep windows disjoint: drop one that starts inside the last
        out.append((start, end))
        t = end


def _request_id(rng: random.Random, i: int) -> str:
    # The shape of vLLM's P-side ids: chatcmpl-<uuid4>-<8 hex>, 54 bytes.
    h = f"{rng.getrandbits(128):032x}"
    return f"chatcmpl-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}-{i & 0xFFFFFFFF:08x}"


def generate(sc: Scenario, seed: int) -> Workload:
    """Draw the workload of ``sc`` for ``seed`` (deterministic)."""
    rng = random.Random(seed)
    wl = Workload(sc, seed)
    wl.arrival = _arrivals(sc, rng)
    lo, hi = sc.prompt_tokens
    olo, ohi = sc.output_tokens
    for i in range(len(wl.arrival)):
        tokens = rng.randint(lo, hi)
        blocks = -(-tokens // sc.block_tokens)
        wl.rid.append(_request_id(rng, i))
        wl.blocks.append(blocks)
        wl.prefill_s.append(sc.prefill_base + tokens * sc.prefill_per_token)
        wl.read_s.append(sc.read_base + blocks * sc.read_per_block)
        wl.decode_s.append(rng.randint(olo, ohi) * sc.decode_per_token)
    # Stalls cover the arrivals window and a long drain after it.
    horizon = sc.duration * 2 + 1200.0
    wl.stalls = [_stalls(sc, rng, horizon) for _ in range(sc.d_engines)]
    wl.p_phase = [rng.uniform(0, sc.p_step) for _ in range(sc.p_engines)]
    wl.d_phase = [rng.uniform(0, sc.d_step) for _ in range(sc.d_engines)]
    return wl
