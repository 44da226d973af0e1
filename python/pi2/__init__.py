"""pi2: run language models larger than memory, from Python.

    import pi2
    model = pi2.Model("qwen2.5-coder-0.5b", mem_budget="50%")
    print(model.generate("def fib(n):", max_tokens=64, temperature=0))
    for piece in model.chat([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece, end="", flush=True)

The engine runs in Rust with the GIL released; Ctrl-C stops a generation and raises
KeyboardInterrupt, keeping the model usable.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from ._native import NativeModel, Pi2Error, Request, TextStream, __version__, catalogue
from ._native import calls_grammar as _native_calls_grammar

__all__ = ["ChatStream", "Model", "Pi2Error", "Request", "TextStream", "catalogue", "__version__"]

Message = Dict[str, Any]


def _stops(stop: Union[None, str, Sequence[str]]) -> List[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    stops = list(stop)
    for i, s in enumerate(stops):
        if not isinstance(s, str):
            raise TypeError(f"stop[{i}] is {type(s).__name__}, not str")
    return stops


def _format_schema(fmt: Dict[str, Any]) -> Optional[str]:
    """OpenAI's ``response_format`` as a JSON schema text (``None`` for plain text)."""
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps(fmt.get("schema", {}))
    if kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if schema is None:
            raise ValueError("response_format json_schema needs json_schema.schema")
        return json.dumps(schema)
    raise ValueError(f"response_format type {kind!r} is not one of text, json_object, json_schema")


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts."""
    if isinstance(content, list):
        parts = []
        for j, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise ValueError(f"{where}[{j}] is not a text part")
            parts.append(p["text"])
        return "".join(parts)
    if not isinstance(content, str):
        raise ValueError(f"{where} is missing or not a string")
    return content


def _messages(messages: Sequence[Message]) -> List[tuple]:
    """OpenAI-style messages as the native side takes them: (role, content, calls, tool_call_id,
    name); an assistant turn's ``tool_calls`` (content may be None) and ``tool`` turns are kept."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TypeError(f"messages[{i}] is {type(m).__name__}, not a dict")
        role = m.get("role")
        if not isinstance(role, str):
            raise ValueError(f"messages[{i}]['role'] is missing or not a string")
        calls = []
        for k, c in enumerate(m.get("tool_calls") or []):
            f = c.get("function") if isinstance(c, dict) else None
            if not (isinstance(f, dict) and isinstance(f.get("name"), str)):
                raise ValueError(f"messages[{i}]['tool_calls'][{k}] is not {{'function': {{'name': ..., 'arguments': ...}}}}")
            args = f.get("arguments", {})
            calls.append((str(c.get("id") or f"call_{i}_{k}"), f["name"], args if isinstance(args, str) else json.dumps(args)))
        content = m.get("content")
        content = "" if content is None and calls else _text(content, f"messages[{i}]['content']")
        reasoning = m.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise ValueError(f"messages[{i}]['reasoning_content'] is not a string")
        out.append((role, content, calls, m.get("tool_call_id"), m.get("name"), reasoning))
    return out


def _tools(tools: Optional[Sequence[Dict[str, Any]]], tool_choice: Any, parallel_tool_calls: Optional[bool]):
    """OpenAI's tools and tool_choice: (tools JSON text, names, grammar of a required call, calls
    allowed), or Nones when no tools are offered (or ``tool_choice="none"``)."""
    choice = "auto" if tool_choice is None else tool_choice
    named = None
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name")
        if choice.get("type") != "function" or not isinstance(named, str):
            raise ValueError("tool_choice is auto, none, required or {'type': 'function', 'function': {'name': ...}}")
        choice = "named"
    elif choice not in ("auto", "none", "required"):
        raise ValueError(f"tool_choice={choice!r} is not one of auto, none, required, or a function")
    if not tools:
        if choice in ("required", "named"):
            raise ValueError("tool_choice asks for a call but tools is empty")
        return None, None, None, 0
    if choice == "none":
        return None, None, None, 0
    defs = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not (t.get("type") == "function" and isinstance(f, dict) and isinstance(f.get("name"), str) and f["name"]):
            raise ValueError(f"tools[{i}] is not {{'type': 'function', 'function': {{'name': ...}}}}")
        defs.append(f)
    names = [f["name"] for f in defs]
    parallel = True if parallel_tool_calls is None else bool(parallel_tool_calls)
    grammar = None
    if choice != "auto":
        allowed = [f for f in defs if choice != "named" or f["name"] == named]
        if not allowed:
            raise ValueError(f"tool_choice names {named!r}, which is not in tools")
        params = [(f["name"], None if f.get("parameters") is None else json.dumps(f["parameters"])) for f in allowed]
        grammar = _native_calls_grammar(params, parallel)
    listed = json.dumps([{"type": "function", "function": f} for f in defs])
    return listed, names, grammar, (1 << 30) if parallel else 1


def _calls_json(calls: List[tuple], ident: str) -> List[Dict[str, Any]]:
    return [{"index": i, "id": f"call_{ident}_{i}", "type": "function",
             "function": {"name": name, "arguments": args}} for i, (name, args) in enumerate(calls)]


def _completion_logprobs(entries: List[Dict[str, Any]], offset: int = 0) -> Dict[str, Any]:
    """Legacy completions' logprobs from chat's entries (OpenAI's two shapes of the same scores)."""
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        offsets.append(offset)
        offset += len(e["bytes"])
        tokens.append(e["token"])
        lps.append(e["logprob"])
        tops.append({t["token"]: t["logprob"] for t in e["top_logprobs"]})
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _scores_wanted(logprobs: Any, top_logprobs: Optional[int]) -> Optional[int]:
    """Chat's ``logprobs``/``top_logprobs`` as a count of alternatives (None: not asked)."""
    if top_logprobs is not None and not logprobs:
        raise ValueError("top_logprobs needs logprobs=True")
    if not logprobs:
        return None
    n = 0 if top_logprobs is None else int(top_logprobs)
    if not 0 <= n <= 20:
        raise ValueError(f"top_logprobs={top_logprobs}: give 0 to 20")
    return n


class ChatStream:
    """The content of a streamed chat reply, piece by piece (a thinking model's reasoning left
    out); ``close()``, ``finish_reason`` and ``stats`` as ``TextStream``'s."""

    def __init__(self, pieces: TextStream, reader: Any) -> None:
        self._pieces, self._reader, self._done = pieces, reader, False

    def __iter__(self) -> "ChatStream":
        return self

    def __next__(self) -> str:
        while not self._done:
            try:
                piece = next(self._pieces)
            except StopIteration:
                self._done = True
                content = self._reader.finish()[1]
                if content:
                    return content
                break
            content = self._reader.push(piece)[1]
            if content:
                return content
        raise StopIteration

    def close(self) -> None:
        self._done = True
        self._pieces.close()

    @property
    def finish_reason(self) -> Optional[str]:
        return self._pieces.finish_reason

    @property
    def stats(self) -> Optional[Dict[str, Any]]:
        return self._pieces.stats


class Model:
    """A language model, possibly larger than memory.

    ``model`` is a GGUF path or a catalogue name (fetched and verified on first use; see
    ``pi2.catalogue()``), or None for the default model. ``mem_budget`` caps the memory the
    model uses: bytes with a unit ("300M") or a share of the file ("50%"), over the interpreter's
    own memory at ``import pi2``; a plain GGUF under
    a budget is converted once (minutes, up to half an hour on a small CPU) and the conversion cached. ``n_batch`` is the
    prompt batch (default 512 in memory, 64 under a budget, whose room the batch buffers share).
    """

    def __init__(
        self,
        model: Optional[str] = None,
        *,
        mem_budget: Optional[str] = None,
        plan: Optional[str] = None,
        threads: Optional[int] = None,
        cores: Optional[str] = None,
        n_ctx: int = 4096,
        n_batch: Optional[int] = None,
        verbose: bool = False,
    ) -> None:
        if mem_budget is not None and not isinstance(mem_budget, str):
            raise TypeError("mem_budget must be a string such as '50%' or '300M'")
        self.name = model or "pi2"
        self._native = NativeModel(model, mem_budget, plan, threads, cores, n_ctx, n_batch, verbose)

    # -- tokens -------------------------------------------------------------------------
    def tokenize(self, text: Union[str, bytes], add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of ``text``; ``special`` turns control-token text into control tokens."""
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}, not str")
        return self._native.tokenize(text, add_bos, special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._native.detokenize(list(tokens))

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                            tools: Optional[Sequence[Dict[str, Any]]] = None) -> str:
        listed = json.dumps([dict(t) for t in tools]) if tools else None
        return self._native.apply_chat_template(_messages(messages), add_generation_prompt, listed)

    @property
    def n_ctx(self) -> int:
        return self._native.n_ctx

    @property
    def n_vocab(self) -> int:
        return self._native.n_vocab

    @property
    def path(self) -> str:
        """The file the model runs from (under a budget, its conversion)."""
        return self._native.path

    @property
    def offloaded(self) -> bool:
        return self._native.offloaded

    def stats(self) -> Optional[Dict[str, Any]]:
        """The last generation's counts: tokens, times, tokens per second, bytes read per
        token, peak RSS, drafts."""
        return self._native.stats()

    def reset(self) -> None:
        """Forget the conversation held in the KV cache."""
        self._native.reset()

    def close(self) -> None:
        self._native.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- generation ---------------------------------------------------------------------
    def _run(self, tokens: List[int], stream: bool, **kw: Any):
        """Generates from ``tokens``: the text, or with ``stream`` the native stream (pieces,
        or (piece, scores) with ``logprobs``). Scores of a whole answer go to ``_last_scores``."""
        kw["stop"] = _stops(kw.get("stop"))
        bias = kw.pop("logit_bias", None) or {}
        kw["logit_bias"] = [(int(t), float(b)) for t, b in bias.items()]
        fmt = kw.pop("response_format", None)
        if fmt is not None:
            kw["json_schema"] = _format_schema(fmt)
        schema = kw.get("json_schema")
        if schema is not None and not isinstance(schema, str):
            kw["json_schema"] = json.dumps(schema)
        request = Request(**kw)
        if stream:
            return self._native.stream_tokens(tokens, request)
        text, finish, _stats, scores = self._native.generate_tokens(tokens, request)
        self._last_finish = finish
        self._last_scores = None if scores is None else json.loads(scores)
        return text

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int = 256,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        seed: Optional[int] = None,
        stop: Union[None, str, Sequence[str]] = None,
        stream: bool = False,
        ignore_eos: bool = False,
        draft_max: int = 0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Optional[Dict[int, float]] = None,
        grammar: Optional[str] = None,
        json_schema: Union[None, str, Dict[str, Any]] = None,
    ) -> Union[str, TextStream]:
        """The continuation of ``prompt`` (control-token text in it is parsed, as
        ``pi2 run -p`` does): a string, or with ``stream=True`` an iterator of text pieces.
        ``max_tokens=-1`` generates until end of generation; ``presence_penalty``,
        ``frequency_penalty`` and ``logit_bias`` ({token id: bias}) are OpenAI's; ``draft_max`` > 0 decodes
        speculatively with drafts from the context (the same output, often faster). ``grammar``
        (llama.cpp's GBNF) or ``json_schema`` (a dict or JSON text; ``{}`` is any object) holds
        the output to it: tokens it forbids are never drawn, so the text parses."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt is {type(prompt).__name__}, not str")
        tokens = self._native.tokenize(prompt, True, True)
        return self._run(tokens, stream, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed, stop=stop,
                         ignore_eos=ignore_eos, draft_max=draft_max, presence_penalty=presence_penalty,
                         frequency_penalty=frequency_penalty, logit_bias=logit_bias, grammar=grammar,
                         json_schema=json_schema)

    def embed(self, input: Union[str, Sequence[str]], *, pooling: str = "mean") -> Union[List[float], List[List[float]]]:
        """The embedding of a text (a list of floats), or of each of a list of texts: final
        hidden states pooled (``mean``, ``cls`` or ``last``) and L2-normalized, as
        ``pi2 embed`` and the server's ``/v1/embeddings``. Forgets the conversation."""
        texts = [input] if isinstance(input, str) else list(input)
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"input holds {type(t).__name__}, not str")
        out = [self._native.embed_tokens(self._native.tokenize(t, True, False), pooling) for t in texts]
        return out[0] if isinstance(input, str) else out

    def create_embedding(self, input: Union[str, Sequence[str]], *, pooling: str = "mean") -> Dict[str, Any]:
        """An OpenAI-shaped embeddings list (as llama-cpp-python's)."""
        texts = [input] if isinstance(input, str) else list(input)
        vectors = self.embed(texts, pooling=pooling)
        used = sum(len(self._native.tokenize(t, True, False)) for t in texts)
        return {"object": "list", "model": self.name,
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": used, "total_tokens": used}}

    def chat(self, messages: Sequence[Message], *, stream: bool = False, **kw: Any) -> Union[str, "ChatStream"]:
        """The content of the assistant's reply to OpenAI-style ``messages`` through the model's
        chat template (message text never becomes control tokens); options as ``generate``. A
        thinking model's reasoning is left out (``create_chat_completion`` gives it)."""
        tokens = self._native.chat_tokens(_messages(messages))
        reader = self._native.answer_reader(tokens)
        if stream:
            return ChatStream(self._run(tokens, True, chat=True, **kw), reader)
        return self._read_all(reader, reader.push(self._run(tokens, False, chat=True, **kw)))[1]

    @staticmethod
    def _read_all(reader: Any, pushed: Optional[tuple] = None) -> tuple:
        """The reader's (reasoning, content, calls), with what ``pushed`` already returned."""
        r0, c0 = pushed or ("", "")
        r, c, calls = reader.finish()
        return r0 + r, c0 + c, calls

    def create_chat_completion(
        self,
        messages: Sequence[Message],
        *,
        stream: bool = False,
        tools: Optional[Sequence[Dict[str, Any]]] = None,
        tool_choice: Any = None,
        parallel_tool_calls: Optional[bool] = None,
        logprobs: Optional[bool] = None,
        top_logprobs: Optional[int] = None,
        reasoning_format: str = "auto",
        **kw: Any,
    ) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """An OpenAI-shaped chat completion (as llama-cpp-python's): a dict, or with
        ``stream=True`` an iterator of ``chat.completion.chunk`` dicts. ``tools`` and
        ``tool_choice`` offer functions (calls come back as ``message.tool_calls``; ``required``
        or a named function holds the answer to calls by a grammar); ``logprobs`` with
        ``top_logprobs`` scores each token; a thinking model's reasoning is
        ``reasoning_content`` (``reasoning_format`` as llama-server's)."""
        listed, names, grammar, max_calls = _tools(tools, tool_choice, parallel_tool_calls)
        if grammar is not None:
            kw["calls_grammar"] = grammar
        scores = _scores_wanted(logprobs, top_logprobs)
        tokens = self._native.chat_tokens(_messages(messages), listed)
        reader = self._native.answer_reader(tokens, reasoning_format, names)
        ident = "chatcmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        if stream:
            pieces = self._run(tokens, True, chat=True, logprobs=scores, **kw)
            return self._chunks(pieces, reader, ident, created, max_calls)
        text = self._run(tokens, False, chat=True, logprobs=scores, **kw)
        reasoning, content, calls = self._read_all(reader, reader.push(text))
        calls = calls[:max_calls]
        message: Dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = _calls_json(calls, ident)
        st = self._native.stats() or {}
        completion = st.get("generated_tokens", 0)
        return {
            "id": ident,
            "object": "chat.completion",
            "created": created,
            "model": self.name,
            "choices": [{
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else self._last_finish,
                "logprobs": None if scores is None else {"content": self._last_scores},
            }],
            "usage": {
                "prompt_tokens": len(tokens),
                "completion_tokens": completion,
                "total_tokens": len(tokens) + completion,
            },
        }

    def _chunks(self, pieces: TextStream, reader: Any, ident: str, created: int,
                max_calls: int) -> Iterator[Dict[str, Any]]:
        def chunk(delta: Dict[str, Any], finish: Optional[str], scores: Any = None) -> Dict[str, Any]:
            return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": self.name,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                 "logprobs": None if scores is None else {"content": scores}}]}

        def parts(reasoning: str, content: str, scores: Any = None) -> Iterator[Dict[str, Any]]:
            if reasoning:
                yield chunk({"reasoning_content": reasoning}, None)
            if content or scores is not None:
                yield chunk({"content": content}, None, scores)

        try:
            yield chunk({"role": "assistant"}, None)
            for piece in pieces:
                text, scores = piece if isinstance(piece, tuple) else (piece, None)
                yield from parts(*reader.push(text), None if scores is None else json.loads(scores))
            reasoning, content, calls = reader.finish()
            yield from parts(reasoning, content)
            calls = calls[:max_calls]
            if calls:
                yield chunk({"tool_calls": _calls_json(calls, ident)}, None)
            yield chunk({}, "tool_calls" if calls else pieces.finish_reason)
        finally:
            pieces.close()

    def create_completion(self, prompt: str, *, stream: bool = False, logprobs: Optional[int] = None, **kw: Any):
        """An OpenAI-shaped text completion: a dict, or an iterator of chunks. ``logprobs=N``
        scores each token with N alternatives (0 to 20), in the legacy completions' shape."""
        if logprobs is not None and not 0 <= int(logprobs) <= 20:
            raise ValueError(f"logprobs={logprobs}: give 0 to 20 alternatives")
        ident = "cmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        if not isinstance(prompt, str):
            raise TypeError(f"prompt is {type(prompt).__name__}, not str")
        tokens = self._native.tokenize(prompt, True, True)
        out = self._run(tokens, stream, logprobs=logprobs, **kw)

        def body(text: str, finish: Optional[str], scores: Any = None) -> Dict[str, Any]:
            return {"id": ident, "object": "text_completion", "created": created, "model": self.name,
                    "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": scores}]}

        if stream:
            def chunks() -> Iterator[Dict[str, Any]]:
                offset = 0
                try:
                    for piece in out:
                        text, scores = piece if isinstance(piece, tuple) else (piece, None)
                        if scores is not None:
                            scores = _completion_logprobs(json.loads(scores), offset)
                        offset += len(text.encode("utf-8"))
                        yield body(text, None, scores)
                    yield body("", out.finish_reason)
                finally:
                    out.close()
            return chunks()
        st = self._native.stats() or {}
        scores = None if logprobs is None else _completion_logprobs(self._last_scores or [])
        result = body(out, self._last_finish, scores)
        n_gen = st.get("generated_tokens", 0)
        result["usage"] = {"prompt_tokens": len(tokens), "completion_tokens": n_gen, "total_tokens": len(tokens) + n_gen}
        return result
