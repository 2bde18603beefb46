"""Which runtime runs each role, chosen from the machine's calibration (bench/measure/calibrate.py),
never from another machine's numbers: pure functions of the calibration file's `entries`.

    plain   the fastest plain decoding of the cloud model:   argmin_r step_ms(r), and every runtime
            whose step is within PLAIN_MARGIN of it (a close call is settled by the sweep's own
            interleaved plain decodings, not by the calibration's few rounds: measured beats modelled)
    cloud   the verifier of speculative points:              argmin_r mean_k step_ms(r) * block_steps(r, k+1)
            over the grid's k; where the grid holds a lossless policy (greedy, sample) only runtimes
            whose block logits equal their step logits (measured: the calibration's `block_vs_steps`)
            qualify, so the lossless text is the verifier's own (none here: the cheapest, said so).
            Among the runtimes whose blocks cost within CLOSE_BLOCKS of the cheapest, the fastest step:
            a generation also pays the verifier's prefill (its first token) and, where a drafter does
            not speculate (`auto`), its plain steps, and blocks that close are not told apart by the
            calibration's few rounds
    edge    the drafter's runtime:                           argmin_r step_ms(r) of the edge model

A choice carries its reason (the figures it was made from), for the sweep's log and the report's header. The plain
and cloud reasons also say how fast the chosen runtime prefills the calibration's prompt and which runtime prefills
it fastest: a generation's first token comes from the prompt's prefill in the verifier's own runtime (its cache is
what the verify blocks continue, so a faster runtime's prefill would change the text), and on a CPU a long prompt's
prefill is most of the time to it.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec.core.policies import policies_that
from specdec.errors import ConfigError
from specdec.runtime_registry import batch_invariant, declared

PLAIN_MARGIN = 1.25  # a runtime whose step is within 25 % of the fastest is also timed as plain decoding
# Verify blocks within 10 % of the cheapest are a close call, settled by the step (the module's docstring). On the AMD
# EPYC run on its AVX2 path (2026-11-30, night) the blocks at k = 2, 4, 6 averaged kernels-int8 78 ms, onnx-int4 78,
# kernels-int4 83, and the cheapest block chose kernels-int8, whose step (47 ms against 38) and prefill (95 tok/s
# against 109) are slower: its lossless points paid ~0.34 s more to their first token and all lost to plain
# kernels-int4 (docs/main-job.md). The calibration's block figures move by about that much from run to run.
CLOSE_BLOCKS = 1.10
LOSSLESS_POLICIES = policies_that("lossless")  # policies that emit the verifier's own tokens (or distribution)


@dataclass(frozen=True)
class RuntimeChoice:
    role: str  # plain, cloud or edge
    model: str
    runtimes: tuple[str, ...]  # the chosen one first
    reason: str  # the figures the choice was made from, one line


def usable(calibration: dict, model: str, candidates: tuple[str, ...], threads: int | None = None) -> dict[str, dict]:
    """{runtime: entry} of `model` among `candidates` that were measured without an error (at `threads`,
    where given: a file may hold other thread counts too)."""
    found = {e["runtime"]: e for e in calibration.get("entries", [])
             if e.get("model") == model and e.get("runtime") in candidates and not e.get("error") and e.get("step_ms")
             and (threads is None or e.get("threads") in (None, threads))}
    if not found:
        failed = [f"{e['runtime']}: {e['error']}" for e in calibration.get("entries", [])
                  if e.get("model") == model and e.get("error")]
        raise ConfigError(f"the calibration has no working runtime among {', '.join(candidates)} for {model!r}"
                          + (f" ({'; '.join(failed)})" if failed else "")
                          + ": run `specbench calibrate --force`, or name the runtimes instead of auto")
    return found


def block_ms(entry: dict, k: int) -> float:
    """What verifying k draft tokens costs: a (k+1)-token block, in ms."""
    steps = entry["block_steps"].get(str(k + 1))
    if steps is None:
        raise ConfigError(f"the calibration of {entry['runtime']} has no {k + 1}-token block (k = {k}): "
                          "run `specbench calibrate --force`, or lower k")
    return entry["step_ms"] * steps


def _figures(entries: dict[str, dict], value) -> str:
    return ", ".join(f"{r} {value(e):.0f} ms" for r, e in sorted(entries.items(), key=lambda kv: value(kv[1])))


def first_token_note(entries: dict[str, dict], chosen: str) -> str:
    """`; first token: A prefills the calibration's 800-token prompt at 155 tok/s (fastest: B 189 tok/s)`, or ""
    where the chosen runtime's entry has no prefill measured (`prefill_tokens_per_s`, the median round's rate)."""
    rates = {r: e["prefill_tokens_per_s"] for r, e in entries.items() if e.get("prefill_tokens_per_s") is not None}
    if chosen not in rates:
        return ""
    fastest = max(rates, key=lambda r: rates[r])
    tokens = entries[chosen].get("prefill_tokens")  # absent from files written before it
    prompt = f"the calibration's {tokens}-token prompt" if tokens else "the calibration's prompt"
    return (f"; first token: {chosen} prefills {prompt} at {rates[chosen]:.0f} tok/s"
            + (", the fastest measured" if fastest == chosen else f" (fastest: {fastest} {rates[fastest]:.0f} tok/s)"))


def fastest_plain(calibration: dict, model: str, candidates: tuple[str, ...], role: str = "plain",
                  margin: float = PLAIN_MARGIN, threads: int | None = None) -> RuntimeChoice:
    entries = usable(calibration, model, candidates, threads)
    best = min(entries.values(), key=lambda e: e["step_ms"])
    close = sorted((r for r, e in entries.items() if e["step_ms"] <= margin * best["step_ms"]),
                   key=lambda r: entries[r]["step_ms"])
    note = first_token_note(entries, close[0]) if role == "plain" else ""
    return RuntimeChoice(role, model, tuple(close), f"a token step: {_figures(entries, lambda e: e['step_ms'])}{note}")


def block_equals_steps(entry: dict) -> bool:
    """The runtime's block rows are its steps' logits exactly: measured by the calibration (`block_vs_steps`
    == 0), or, for an entry measured before that, the runtime's design on this CPU (base.batch_invariant)."""
    measured = entry.get("block_vs_steps")
    return batch_invariant(entry["runtime"]) if measured is None else measured == 0.0


def cheapest_verifier(calibration: dict, model: str, candidates: tuple[str, ...], ks: tuple[int, ...],
                      policies: tuple[str, ...], threads: int | None = None) -> RuntimeChoice:
    entries = everything = usable(calibration, model, candidates, threads)
    lossless = any(p in LOSSLESS_POLICIES for p in policies)
    why = ""
    if lossless:
        exact = {r: e for r, e in entries.items() if block_equals_steps(e)}
        if exact:
            entries, why = exact, "its blocks compute its steps' logits exactly (a lossless policy is in the grid), "
        else:  # nothing reproduces its own plain decoding here: the cheapest, and the reason says so
            why = ("no runtime's blocks equal its steps on this machine, so lossless points are not the verifier's "
                   "own text; ")

    def cost(entry: dict) -> float:
        return sum(block_ms(entry, k) for k in ks) / len(ks)

    cheapest = min(cost(e) for e in entries.values())
    close = {r: e for r, e in entries.items() if cost(e) <= CLOSE_BLOCKS * cheapest}
    best = min(close, key=lambda r: (close[r]["step_ms"], cost(close[r])))
    settled = (f"; within {round((CLOSE_BLOCKS - 1) * 100)} % of the cheapest block, the fastest step: "
               f"{_figures(close, lambda e: e['step_ms'])}" if len(close) > 1 else "")
    return RuntimeChoice("cloud", model, (best,), f"{why}a verify block at k = {', '.join(map(str, ks))}: "
                                                  f"{_figures(entries, cost)}{settled}"
                                                  f"{first_token_note(everything, best)}")




def parameters_at_most(entries: dict[str, dict]) -> float:
    """The model's parameters, over-counted by none of the measured entries: min of weight_bytes * 8 / bits, a
    runtime's bits the fewest it reads per weight (its declaration's weight_bits: scales and the embedding left out),
    so with the measured bandwidth they give the step no runtime can beat (its floor), known before it is loaded."""
    return min(e["weight_bytes"] * 8 / declared(r).weight_bits for r, e in entries.items() if e.get("weight_bytes"))


def cannot_win(runtime: str, floor_ms: float, entries: dict[str, dict], ks: tuple[int, ...],
               policies: tuple[str, ...], roles: tuple[str, ...]) -> str | None:
    """Why `runtime`, whose step reads at least `floor_ms` of weights, can win none of `roles` (plain, cloud, edge)
    against the measured `entries` (a block costs at least a step, a step at least its floor), or None where it might.
    A lower bound against measurements: nothing about the runtime is predicted."""
    best_step = min(e["step_ms"] for e in entries.values())
    if "plain" in roles and floor_ms <= PLAIN_MARGIN * best_step:
        return None
    if "edge" in roles and floor_ms <= best_step:
        return None
    if "cloud" in roles:
        exact = {r: e for r, e in entries.items() if block_equals_steps(e)}
        pool: dict[str, dict] | None = entries
        if any(p in LOSSLESS_POLICIES for p in policies):  # the verifier must be exact where one is
            if not exact:
                pool = {} if batch_invariant(runtime) else entries  # an exact one would win outright
            else:
                pool = exact if batch_invariant(runtime) else None
        if pool == {}:
            return None
        if pool and floor_ms <= min(sum(block_ms(e, k) for k in ks) / len(ks) for e in pool.values()):
            return None
    return (f"its floor ({floor_ms:.0f} ms a step at the measured bandwidth) is above what {', '.join(sorted(entries))} "
            "measured for every role it could take")


def verify_cost_ms(entry: dict) -> tuple[float, float]:
    """A verify forward of m tokens as A + B·m ms (the cost model's verify line, bench/derive/costmodel.py),
    least squares over the calibration's block curve: t(m) = step_ms * block_steps(m), m = 1..9. B may come
    out 0 (a flat curve) but not below."""
    sizes = sorted(int(m) for m in entry["block_steps"])
    times = [entry["step_ms"] * entry["block_steps"][str(m)] for m in sizes]
    mean_m, mean_t = sum(sizes) / len(sizes), sum(times) / len(times)
    spread = sum((m - mean_m) ** 2 for m in sizes)
    slope = max(0.0, sum((m - mean_m) * (t - mean_t) for m, t in zip(sizes, times)) / spread) if spread else 0.0
    return max(mean_t - slope * mean_m, 1e-3), slope
