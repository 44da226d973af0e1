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

__all__ = ["Model", "Pi2Error", "Request", "TextStream", "catalogue", "__version__"]

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


def _pairs(messages: Sequence[Message]) -> List[tuple]:
    """(role, content) pairs from OpenAI-style messages; content may be a list of text parts."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    pairs = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TypeError(f"messages[{i}] is {type(m).__name__}, not a dict")
        role, content = m.get("role"), m.get("content")
        if m.get("tool_calls"):
            # Dropping them would change what the model sees without a word.
            raise ValueError(
                f"messages[{i}] has tool_calls, which the Python package does not render yet: "
                "send tool conversations to `pi2 serve` (/v1/chat/completions takes tools and tool_calls)")
        if not isinstance(role, str):
            raise ValueError(f"messages[{i}]['role'] is missing or not a string")
        if isinstance(content, list):
            parts = []
            for j, p in enumerate(content):
                if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                    raise ValueError(f"messages[{i}]['content'][{j}] is not a text part")
                parts.append(p["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}]['content'] is missing or not a string")
        pairs.append((role, content))
    return pairs


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

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        return self._native.apply_chat_template(_pairs(messages), add_generation_prompt)

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
        text, finish, _stats = self._native.generate_tokens(tokens, request)
        self._last_finish = finish
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

    def chat(self, messages: Sequence[Message], *, stream: bool = False, **kw: Any) -> Union[str, TextStream]:
        """The assistant's reply to OpenAI-style ``messages`` through the model's chat
        template (message text never becomes control tokens); options as ``generate``."""
        tokens = self._native.chat_tokens(_pairs(messages))
        return self._run(tokens, stream, **kw)

    def create_chat_completion(
        self, messages: Sequence[Message], *, stream: bool = False, **kw: Any
    ) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """An OpenAI-shaped chat completion (as llama-cpp-python's): a dict, or with
        ``stream=True`` an iterator of ``chat.completion.chunk`` dicts."""
        tokens = self._native.chat_tokens(_pairs(messages))
        ident = "chatcmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        if stream:
            return self._chunks(self._run(tokens, True, **kw), ident, created)
        text = self._run(tokens, False, **kw)
        st = self._native.stats() or {}
        completion = st.get("generated_tokens", 0)
        return {
            "id": ident,
            "object": "chat.completion",
            "created": created,
            "model": self.name,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": self._last_finish,
                "logprobs": None,
            }],
            "usage": {
                "prompt_tokens": len(tokens),
                "completion_tokens": completion,
                "total_tokens": len(tokens) + completion,
            },
        }

    def _chunks(self, pieces: TextStream, ident: str, created: int) -> Iterator[Dict[str, Any]]:
        def chunk(delta: Dict[str, Any], finish: Optional[str]) -> Dict[str, Any]:
            return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": self.name,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

        try:
            yield chunk({"role": "assistant"}, None)
            for piece in pieces:
                yield chunk({"content": piece}, None)
            yield chunk({}, pieces.finish_reason)
        finally:
            pieces.close()

    def create_completion(self, prompt: str, *, stream: bool = False, **kw: Any):
        """An OpenAI-shaped text completion: a dict, or an iterator of chunks."""
        ident = "cmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        out = self.generate(prompt, stream=stream, **kw)

        def body(text: str, finish: Optional[str]) -> Dict[str, Any]:
            return {"id": ident, "object": "text_completion", "created": created, "model": self.name,
                    "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}

        if stream:
            def chunks() -> Iterator[Dict[str, Any]]:
                try:
                    for piece in out:
                        yield body(piece, None)
                    yield body("", out.finish_reason)
                finally:
                    out.close()
            return chunks()
        st = self._native.stats() or {}
        result = body(out, self._last_finish)
        n_prompt = len(self._native.tokenize(prompt, True, True))
        n_gen = st.get("generated_tokens", 0)
        result["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen}
        return result
