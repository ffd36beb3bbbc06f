"""The load generator: asynchronous OpenAI-compatible streaming requests at a
fixed concurrency (closed loop: C clients, each sends its next request when
the last one ends), fixed input and output lengths.

Definitions match `vllm bench serve`: TTFT = first token chunk - request start;
ITL = gaps between consecutive token chunks; TPOT = (E2E - TTFT) / (output
tokens - 1); E2E = last token chunk - request start; output tok/s = output
tokens of successful requests / wall time of the round.

Units: *_ms milliseconds, t_*_ns / t_ns wall clock (time.time_ns(), the same
clock the hook stamps its records with, so client and server events line up
on one host). Each request reads the wall clock at its send and times its
tokens from there on the monotonic clock (RequestClock): a step of the wall
clock (NTP correcting a freshly booted machine, an operator) moves the next
request with the hook's stamps instead of every later one, and a step during
a request is measured and kept in its row (clock_step_ms).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from tpcomm import jsonsafe, netread
from tpcomm.attribute import aiorun
from tpcomm.attribute.server import ServerInfo

ABORT_POLL_S = 0.5  # how often a round asks `abort` whether to end early

CLOCK_STEP_MS = 1.0  # the wall clock moved against the monotonic one by more than this: it was stepped


def wall_anchor_ns() -> tuple[int, int]:
    """(wall clock minus monotonic clock, its uncertainty), both ns: the tightest of three bracketed reads (a
    process descheduled between two reads would otherwise put its pause into the anchor)."""
    best = None
    for _ in range(3):
        p0 = time.perf_counter_ns()
        w = time.time_ns()
        p1 = time.perf_counter_ns()
        if best is None or p1 - p0 < best[1] * 2:
            best = (w - (p0 + p1) // 2, (p1 - p0) // 2)
    return best


class RequestClock:
    """One request's event times: the monotonic clock (steady whatever the wall clock does) placed on the wall
    clock as read at the request's send, the clock the hook stamps its records with."""

    def __init__(self):
        self.anchor_ns, self.uncertainty_ns = wall_anchor_ns()

    def now(self) -> int:
        return self.anchor_ns + time.perf_counter_ns()

    def step_ms(self) -> float | None:
        """How far the wall clock was stepped since the send (ms, + forward), None below CLOCK_STEP_MS."""
        anchor, unc = wall_anchor_ns()
        step = (anchor - self.anchor_ns) / 1e6
        return step if abs(step) > CLOCK_STEP_MS + (unc + self.uncertainty_ns) / 1e6 else None


_WORDS = (
    "tensor parallel inference splits every layer across several devices each decode step issues an all "
    "reduce after attention and after the mlp the interconnect latency caps single stream tokens per "
    "second cards without a fast link pay for every collective in microseconds quick brown fox jumps over "
    "the lazy dog while the scheduler batches requests and the sampler picks the next token"
).split()


@dataclass
class LoadSpec:
    api: str = "completions"  # completions | chat
    input_len: int = 32
    output_len: int = 32
    requests: int = 8  # per round of a level
    warmup: int = 2  # requests before the first level, not recorded
    max_rounds: int = 3  # a level runs more rounds until it is steady
    steady_pct: float = 10.0  # halves of a round within this -> steady
    spread_pct: float = 10.0  # repeats of a level beyond this -> flagged
    timeout_s: float = 300.0
    seed: int = 0
    # Test hook: (request_id, token_idx, seconds): that request's client stops reading the stream for `seconds`
    # after receiving `token_idx` tokens (an injected client stall; the server keeps generating).
    client_pause: tuple[int, int, float] | None = None


@dataclass
class Prompts:
    """Prompts of exactly input_len tokens where the server can tell us the count."""

    api: str
    input_len: int
    exact: bool
    note: str
    token_pool: list[int] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    chat_words: int = 0  # words per chat message (fitted so that template + words = input_len)
    words: list[str] = field(default_factory=lambda: list(_WORDS))

    def make(self):
        # Fresh random content per request, so the prefix cache cannot skip prefill.
        if self.api == "completions" and self.token_pool:
            return [self.rng.choice(self.token_pool) for _ in range(self.input_len)]
        words = [self.rng.choice(self.words) for _ in range(self.input_len)]
        if self.api == "chat":
            return [{"role": "user", "content": _chat_text(words[: self.chat_words])}]
        return " ".join(words)


def _chat_text(words: list[str]) -> str:
    return "".join(" " + w for w in words)


def build_prompts(info: ServerInfo, spec: LoadSpec) -> Prompts:
    """Completions: random token ids drawn from the tokenizer's own output (exact length).
    Chat: a number of words found with /tokenize so that template + text = input_len."""
    rng = random.Random(spec.seed)

    def tokenize(payload):
        r = netread.request(
            "POST",
            info.url + "/tokenize",
            json={"model": info.model, **payload},
            headers=info.headers,
            timeout_s=30,
            verify=info.verify,
        )
        r.raise_for_status()
        doc = jsonsafe.loads(r.content, "/tokenize")
        count, toks = doc["count"], doc.get("tokens") or []
        if not isinstance(count, int) or not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
            raise ValueError("not a vLLM /tokenize answer")
        return count, toks

    try:
        if spec.api == "completions":
            _, toks = tokenize({"prompt": " ".join(_WORDS) * 2, "add_special_tokens": False})
            pool = sorted(set(toks))
            return Prompts(
                "completions", spec.input_len, True, "token-id prompts of exactly input_len tokens", pool, rng
            )
        # Words that are one token after a space (content " w1 w2 ...") keep words + template exact for any draw.
        single = [w for w in sorted(set(_WORDS)) if tokenize({"prompt": " " + w, "add_special_tokens": False})[0] == 1]
        words = single if len(single) >= 8 else list(_WORDS)
        p = Prompts("chat", spec.input_len, False, "", rng=rng, words=words)
        lo, hi, best = 1, max(2, spec.input_len), 1
        sample = [rng.choice(words) for _ in range(hi)]
        while lo <= hi:  # largest word count whose templated prompt fits input_len
            mid = (lo + hi) // 2
            n, _ = tokenize({"messages": [{"role": "user", "content": _chat_text(sample[:mid])}]})
            if n <= spec.input_len:
                best, lo = mid, mid + 1
                p.exact = n == spec.input_len and words is single
            else:
                hi = mid - 1
        p.chat_words = best
        p.note = (
            f"chat prompts of {best} single-token words + the chat template = input_len tokens (checked with /tokenize)"
            if p.exact
            else "chat prompts fitted with /tokenize to at most input_len tokens "
            "(template included); the count per request is in prompt_tokens"
        )
        return p
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as e:  # BadJSON is a ValueError
        p = Prompts(
            spec.api,
            spec.input_len,
            False,
            f"/tokenize unavailable ({type(e).__name__}): prompts of "
            "input_len words, actual token counts in prompt_tokens",
            rng=rng,
        )
        p.chat_words = spec.input_len
        return p


def _payload(info: ServerInfo, spec: LoadSpec, prompt) -> tuple[str, dict]:
    common = {
        "model": info.model,
        "max_tokens": spec.output_len,
        "min_tokens": spec.output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # Each chunk's token ids (vLLM >= 0.10): how many tokens a chunk holds when the API server coalesced
        # several, so the closure can place each token (pairing.py).
        "return_token_ids": True,
    }
    if spec.api == "chat":
        return "/v1/chat/completions", {**common, "messages": prompt}
    return "/v1/completions", {**common, "prompt": prompt}


async def stream_request(
    client: httpx.AsyncClient,
    info: ServerInfo,
    spec: LoadSpec,
    prompt,
    pause: tuple[int, float] | None = None,
    name: str | None = None,
) -> dict:
    """One streaming request. Returns its row for requests.parquet plus 'token_ns' (arrival of each token chunk)
    and 'token_counts' (tokens in each chunk, -1 where the server did not say). `name`: its X-Request-Id
    (request_name()), by which the hook records which engine steps served it."""
    path, payload = _payload(info, spec, prompt)
    headers = {**(info.headers or {}), "X-Request-Id": name} if name else info.headers
    row = {"ok": False, "error": "", "prompt_tokens": None, "output_tokens": None}
    tokens: list[int] = []
    counts: list[int] = []
    clock = RequestClock()
    t0 = clock.now()
    try:
        async with client.stream("POST", info.url + path, json=payload, headers=headers, timeout=spec.timeout_s) as r:
            if r.status_code != 200:
                body = (await r.aread())[:65536].decode(errors="replace")
                row["error"] = f"HTTP {r.status_code}: {error_text(body, r.headers.get('content-type', ''))}"
            else:
                done = False
                async for line in sse_lines(r, spec.timeout_s):
                    if not line.startswith("data:"):
                        continue  # blank separators and SSE comments (pings)
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    msg = jsonsafe.loads(data, "a stream chunk", "an OpenAI streaming chunk")
                    t = clock.now()
                    if problem := chunk_problem(msg):
                        row["error"] = f"{MALFORMED}: {problem}"
                        break
                    if choices := msg.get("choices"):
                        delta = choices[0].get("delta")
                        # vLLM's chat stream opens with a role-only chunk sent together with the first token.
                        if (
                            delta is not None
                            and "role" in delta
                            and not delta.get("content")
                            and tokens == []
                            and not choices[0].get("finish_reason")
                        ):
                            continue
                        tokens.append(t)
                        ids = choices[0].get("token_ids")
                        if ids is None and isinstance(delta, dict):
                            ids = delta.get("token_ids")
                        counts.append(len(ids) if isinstance(ids, list) else -1)
                        if pause and len(tokens) == pause[0]:
                            await asyncio.sleep(pause[1])
                    elif usage := msg.get("usage"):
                        row["output_tokens"] = _count(usage.get("completion_tokens"))
                        row["prompt_tokens"] = _count(usage.get("prompt_tokens"))
                        # vLLM's fingerprint names its version and TP size: "vllm-0.32.0-tp2-..."
                        fp = msg.get("system_fingerprint")
                        row["fingerprint"] = fp[:200] if isinstance(fp, str) else None
                    if err := msg.get("error"):
                        row["error"] = f"stream error: {str(err)[:300]}"
                if not done and not row["error"]:
                    # vLLM ends every stream with [DONE] (or an error chunk): one that just stops was cut on the
                    # way (a proxy's idle timeout), and its request may still run in the engine beside the next
                    # one this stream sends, which the level would then count as another client's traffic
                    row["error"] = CUT
                row["ok"] = bool(tokens) and not row["error"]
                if not tokens and not row["error"]:
                    row["error"] = "no token chunk received"
    except httpx.HTTPError as e:
        row["error"] = f"{type(e).__name__}: {e}"
    except jsonsafe.BadJSON as e:
        row["error"] = f"{MALFORMED}: {e.what} {e.problem}"[:300]
    t1 = tokens[-1] if tokens else clock.now()
    n_out = row["output_tokens"] or len(tokens)
    # A wall-clock step during the request: its times stay on the send's reading (their differences are right);
    # its end is also given on the clock the hook stamped with by then, so a level's window ends where the
    # hook's records do.
    step = clock.step_ms()
    row.update(
        t_start_ns=t0,
        t_end_ns=t1,
        t_end_wall_ns=t1 + int(round(step * 1e6)) if step is not None else t1,
        clock_step_ms=step,
        # the monotonic clock's readings: a round's duration across requests (each placed on the wall clock as
        # it read at its own send, so two requests' wall times differ by any step between them)
        t_start_mono_ns=t0 - clock.anchor_ns,
        t_end_mono_ns=t1 - clock.anchor_ns,
        token_ns=tokens,
        token_counts=counts,
    )
    if tokens:
        ttft = (tokens[0] - t0) / 1e6
        e2e = (t1 - t0) / 1e6
        row.update(
            ttft_ms=ttft,
            e2e_ms=e2e,
            output_tokens=n_out,
            tpot_ms=(e2e - ttft) / (n_out - 1) if n_out > 1 else None,
            itl_ms_mean=(t1 - tokens[0]) / 1e6 / (len(tokens) - 1) if len(tokens) > 1 else None,
        )
    else:
        row.update(ttft_ms=None, e2e_ms=None, tpot_ms=None, itl_ms_mean=None)
    return row


MALFORMED = "malformed stream"  # a server that streams something other than OpenAI chunks (not vLLM)
CUT = "the stream ended without its [DONE]: cut on the way (a proxy?); the request may still run in the engine"
MAX_LINE = 1 << 20  # one SSE line; vLLM's chunks are a few hundred bytes (a few kB with logprobs)


async def sse_lines(r: httpx.Response, gap_s: float):
    """The lines of a server-sent-event stream, each at most MAX_LINE bytes, a `data:` line at least every
    `gap_s` seconds (httpx's read timeout is per read: a server that drips a byte or a blank line every
    second would otherwise hold the request forever)."""
    buf = bytearray()
    last = time.monotonic()
    async for chunk in r.aiter_bytes():
        buf += chunk
        while (i := buf.find(b"\n")) >= 0:
            line = bytes(buf[:i]).rstrip(b"\r").decode(errors="replace")
            del buf[: i + 1]
            if line.startswith("data:"):
                last = time.monotonic()
            yield line
        if len(buf) > MAX_LINE:
            raise httpx.DecodingError(f"{MALFORMED}: a line longer than {MAX_LINE} bytes", request=r.request)
        if time.monotonic() - last > gap_s:
            raise httpx.ReadTimeout(f"no stream chunk for {gap_s:g} s (bytes kept arriving)", request=r.request)
    if buf:
        yield bytes(buf).rstrip(b"\r").decode(errors="replace")


def chunk_problem(msg) -> str | None:
    """What makes `msg` not an OpenAI streaming chunk (None when it is one): the fields read below, typed."""
    if not isinstance(msg, dict):
        return f"a chunk is a JSON {type(msg).__name__}, not an object"
    choices = msg.get("choices")
    if choices is not None and not (isinstance(choices, list) and all(isinstance(c, dict) for c in choices)):
        return "'choices' is not a list of objects"
    if choices and not isinstance(choices[0].get("delta", {}), (dict, type(None))):
        return "'choices[0].delta' is not an object"
    if msg.get("usage") is not None and not isinstance(msg["usage"], dict):
        return "'usage' is not an object"
    return None


def _count(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def error_text(body: str, content_type: str = "", limit: int = 200) -> str:
    """An error body as one line: an HTML page by its title (or its text without tags), JSON and text with
    their whitespace collapsed; at most `limit` characters."""
    import html
    import re

    if "html" in content_type.lower() or re.match(r"\s*<(!doctype|html)", body, re.I):
        title = re.search(r"<title[^>]*>(.*?)</title>", body, re.I | re.S)
        text = title.group(1) if title else re.sub(r"<[^>]+>", " ", re.sub(r"(?is)<(script|style).*?</\1>", " ", body))
        body = "HTML page: " + html.unescape(text)
    return " ".join(body.split())[:limit] or "(empty body)"


class ServerGone(RuntimeError):
    """The server stopped answering during a round."""


class Aborted(RuntimeError):
    """The round was ended early (`abort` returned a reason: a TP worker stopped answering). args[0]: the rows
    of the requests that ended before; `reason`: why."""

    def __init__(self, rows: list[dict], reason: str):
        super().__init__(rows)
        self.reason = reason


def request_name(token: str, request_id: int) -> str:
    """The X-Request-Id of attribute's request `request_id`: `tpcomm-<token>-<id>`. vLLM 0.32 takes the header as
    its request id (serve/engine/serving.py `_base_request_id`: `cmpl-<header>-<prompt index>`, or
    `chatcmpl-<header>`, plus 8 random hex characters in the engine), and the hook records the steps of a
    request whose token is part of its recording's session name (hook/core.py `request_number`)."""
    return f"tpcomm-{token}-{int(request_id)}"


async def run_round(
    info: ServerInfo,
    spec: LoadSpec,
    prompts: Prompts,
    concurrency: int,
    n_requests: int,
    on_done: Callable[[dict], None] | None = None,
    is_alive: Callable[[], bool] | None = None,
    id_offset: int = 0,
    sink: list[dict] | None = None,
    abort: Callable[[], str | None] | None = None,
    request_token: str | None = None,
) -> list[dict]:
    """Closed loop: `concurrency` clients share `n_requests` requests. Stops early if the server dies
    (raises ServerGone carrying the rows measured so far) or `abort` (polled every ABORT_POLL_S) gives a
    reason (raises Aborted). `sink`: a list that receives each row as its request ends, so a caller
    interrupted meanwhile (Ctrl-C) still has them. `request_token`: each request is sent with
    X-Request-Id request_name(request_token, its id), so the hook can record the steps that served it."""
    rows: list[dict] = sink if sink is not None else []
    next_id = iter(range(id_offset, id_offset + n_requests))
    gone = asyncio.Event()
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)

    async def client_loop(client):
        for i in next_id:
            if gone.is_set():
                return
            cp = spec.client_pause
            row = await stream_request(
                client,
                info,
                spec,
                prompts.make(),
                pause=(cp[1], cp[2]) if cp and cp[0] == i else None,
                name=request_name(request_token, i) if request_token else None,
            )
            row["request_id"] = i
            rows.append(row)
            if on_done:
                on_done(row)
            if not row["ok"] and looks_like_disconnect(row["error"]):
                alive = await asyncio.to_thread(is_alive) if is_alive else True
                if not alive:
                    gone.set()
                    return

    why: list[str] = []

    async def watch(clients: asyncio.Future) -> None:
        while not clients.done():
            reason = await asyncio.to_thread(abort)
            if reason:
                why.append(reason)
                clients.cancel()
                return
            await asyncio.sleep(ABORT_POLL_S)

    async with httpx.AsyncClient(limits=limits, timeout=spec.timeout_s, verify=netread.tls(info.verify)) as client:
        clients = asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        watcher = asyncio.ensure_future(watch(clients)) if abort else None
        try:
            await clients
        except asyncio.CancelledError:
            if not why:
                raise  # not our abort: Ctrl-C or a caller's cancel
        finally:
            if watcher is not None:
                watcher.cancel()
    rows.sort(key=lambda r: r["request_id"])
    if why:
        raise Aborted(rows, why[0])
    if gone.is_set():
        raise ServerGone(rows)
    return rows


def looks_like_disconnect(error: str) -> bool:
    return any(
        k in error
        for k in (
            "ConnectError",
            "RemoteProtocolError",
            "ReadError",
            "ConnectTimeout",
            "ReadTimeout",
            "HTTP 5",
            "without its [DONE]",  # a stream closed cleanly mid-way: a proxy, or a server going away
        )
    )


def warmup(info: ServerInfo, spec: LoadSpec, prompts: Prompts) -> list[dict]:
    if spec.warmup <= 0:
        return []
    return aiorun.run(lambda: run_round(info, spec, prompts, 1, spec.warmup))
